"""bench --plot and tune --plot: PNGs drawn from the rows the commands print."""

import json
import subprocess
import sys

import pytest
from matplotlib.image import imread

from gradsync.tools.plots import bench_plot, tune_plot


def gradsync(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=120)


def test_bench_plot_draws_busbw_against_size_per_algorithm(tmp_path):
    rows = [{"algorithm": a, "bytes": n, "busbw_GBps": g} for a, n, g in
            [("native", 4096, 0.01), ("ring", 4096, 0.005), ("native", 1 << 20, 0.5), ("ring", 1 << 20, 0.7)]]
    series = bench_plot(list(reversed(rows)), str(tmp_path / "b.png"), "test")
    assert series == {"native": [(4096, 0.01), (1 << 20, 0.5)], "ring": [(4096, 0.005), (1 << 20, 0.7)]}
    image = imread(tmp_path / "b.png")
    assert image.shape[:2] == (550, 880) and image.std() > 0.05          # 8 x 5 in at 110 dpi, not blank


def test_tune_plot_from_the_cli_holds_every_candidate_and_the_crossovers(tmp_path):
    path = tmp_path / "t.png"
    run = gradsync("tune", "-t", "ring", "-n", "16", "--max-size", "64MB", "--plot", str(path), "--format", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["crossovers"] and imread(path).shape[:2] == (550, 880)
    series = tune_plot(out["rows"], out["crossovers"], str(tmp_path / "again.png"))
    assert set(series) == set(out["rows"][0]["times_s"])
    assert [p[0] for p in series["ring"]] == [r["bytes"] for r in out["rows"]]


@pytest.mark.parametrize("command", [["tune"], ["bench", "--sizes", "4KB"]])
def test_a_plot_that_is_not_a_png_is_refused_at_once(command, tmp_path):
    run = gradsync(*command, "--plot", str(tmp_path / "x.jpg"))
    assert run.returncode == 2 and "must end in .png" in run.stderr and run.stderr.count("\n") == 1
