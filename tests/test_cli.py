"""The command line, run as a user runs it: output, JSON, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from gradsync import algorithms


def gradsync(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=120)


def test_compare_reproduces_d2l_figures():
    run = gradsync("compare", "--topology", "pcie-switch-4", "--size", "160MB", "--format", "json")
    assert run.returncode == 0, run.stderr
    rows = {r["algorithm"]: r for r in json.loads(run.stdout)}
    assert rows["central"]["time_s"] == pytest.approx(0.060, rel=1e-3)
    assert rows["host"]["time_s"] == pytest.approx(0.080, rel=1e-3)
    assert rows["sharded"]["time_s"] == pytest.approx(0.015, rel=1e-3)
    assert rows["sharded"]["busbw_GBps"] == pytest.approx(16, rel=1e-3)
    # every algorithm but the in-switch reductions, which this server's PCIe switch cannot run (named once)
    assert set(rows) == set(algorithms.names()) - {"nvls", "nvls_tree"}
    assert "left out" in run.stderr and "nvls" in run.stderr
    assert all(rows[a]["error"] == 0 for a in rows if a != "cerar")
    assert 0 < rows["cerar"]["error"] < 1e-2 and rows["cerar"]["components"] == 8


def test_cerar_command_reports_rates_cond_and_errors():
    run = gradsync("cerar", "--workers", "8", "--components", "16", "--format", "json")
    assert run.returncode == 0, run.stderr
    o = json.loads(run.stdout)
    assert o["rounds"] == 22 and o["comm_rate"] == pytest.approx(22 / 16) and o["ring_rate"] == pytest.approx(1.75)
    assert o["storage_rate"] == pytest.approx(1.5) and 1 < o["cond"] < 1e5
    assert 0 < o["rel_error"] < 2 * o["predicted_error"]
    exact = json.loads(gradsync("cerar", "-n", "8", "-c", "8", "--dtype", "float64", "--format", "json").stdout)
    assert exact["rel_error"] < 1e-12 and exact["cond"] < 2


def test_compare_p3_ring_shows_exact_and_seed_approximation():
    run = gradsync("compare", "--topology", "p3.16xlarge", "--size", "160MB")
    assert run.returncode == 0, run.stderr
    assert "5.93 ms" in run.stdout and "54 GB/s" in run.stdout
    ring = next(r for r in json.loads(gradsync("compare", "-t", "p3.16xlarge", "--format", "json").stdout)
                if r["algorithm"] == "ring")
    assert 5.1e-3 <= ring["time_s"] <= 6.0e-3
    assert ring["closed_form_s"] == pytest.approx(ring["time_s"], rel=0.01)
    assert ring["approx_2n_over_B_s"] == pytest.approx(2 * 160e6 / 54e9)


def test_simulate_writes_a_timeline(tmp_path):
    out = tmp_path / "run.json"
    run = gradsync("simulate", "--algorithm", "ring", "--topology", "ethernet", "--workers", "6",
                   "--size", "1MB", "--out", str(out))
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["workers"] == 6 and len(data["timeline"]["done"]) == 2 * 5 * 6


def test_simulate_writes_a_columnar_timeline(tmp_path):
    from gradsync.model.simulate import load_timeline
    out = tmp_path / "run.npz"
    run = gradsync("simulate", "--algorithm", "ring", "--topology", "ethernet", "--workers", "6",
                   "--size", "1MB", "--out", str(out))
    assert run.returncode == 0, run.stderr
    data = load_timeline(out)
    assert data["workers"] == 6 and len(data["timeline"]["done"]) == 2 * 5 * 6
    assert data["timeline"]["done"].max() == pytest.approx(data["time_s"], rel=1e-9)


def test_simulate_takes_algorithm_options():
    run = gradsync("simulate", "-a", "tree", "-t", "ethernet", "-n", "4", "-s", "1MB", "-o", "segments=3",
                   "--format", "json")
    assert json.loads(run.stdout)["rounds"] == 3 + 2 * 2 - 1


# 12 s (tune's crossovers are also checked in process in test_tune): with the slow ones
@pytest.mark.slow
def test_tune_names_a_crossover():
    run = gradsync("tune", "--topology", "ring", "--workers", "16", "--format", "json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["crossovers"] and all(r["best"] == min(r["times_s"], key=r["times_s"].get) for r in data["rows"])


@pytest.mark.parametrize("args,needle", [
    (["compare", "--size", "12XB"], "bad size '12XB'"),
    (["compare", "--topology", "nope"], "unknown topology 'nope'"),
    (["compare", "--workers", "9"], "cannot place 9"),
    (["compare", "--algorithms", "ring,rign"], "unknown algorithm 'rign'"),
    (["simulate", "-a", "tree", "-o", "segments=0"], "segments must be an integer >= 1"),
    (["simulate", "-a", "ring", "-o", "nonsense"], "expected KEY=VALUE"),
    (["simulate"], "Missing option '--algorithm'"),
    (["tune", "--min-size", "1GB", "--max-size", "1KB"], "--min-size <= --max-size"),
    (["compare", "--bogus"], "No such option"),
    (["cerar", "-n", "4", "-c", "8", "--eps", "0"], "'--eps': 0.0 is not in the range"),
    (["cerar", "-n", "8", "-c", "24", "--max-cond", "2"], "no unity design"),
    (["cerar", "-n", "1", "-c", "8"], "'--workers'"),
    (["cerar", "-n", "4", "-c", "8", "--construction", "optimized", "--eps", "0.01"], "takes max_cond, not eps"),
    (["tune", "--max-error", "2"], "'--max-error'"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, needle):
    run = gradsync(*args)
    assert run.returncode == 2
    assert needle in run.stderr and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def test_bad_topology_file_is_one_line(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("nodes: [{name: a, kind: gpu}]\nlinks: [{a: a, b: a, bandwidth: 1GB/s}]\nworkers: [a]\n")
    run = gradsync("compare", "--topology", str(bad))
    assert run.returncode == 2 and "links.0: joins node 'a' to itself" in run.stderr
    assert run.stderr.count("\n") == 1


def test_every_command_has_help():
    for cmd in ([], ["compare"], ["simulate"], ["tune"]):
        run = gradsync(*cmd, "--help")
        assert run.returncode == 0 and "Usage:" in run.stdout


@pytest.mark.slow
def test_bench_over_gloo_sums_exactly_and_calibrate_feeds_its_predictions(tmp_path):
    topology = tmp_path / "calibrated.json"
    run = gradsync("calibrate", "--workers", "2", "--repeats", "3", "--launches", "1", "--out", str(topology))
    assert run.returncode == 0, run.stderr[-2000:]
    run = gradsync("bench", "--workers", "2", "--sizes", "4KB,100KB", "--iters", "7", "--algorithms",
                   "ring,tree,cerar", "--topology", str(topology), "--format", "json")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    assert sorted((r["bytes"], r["algorithm"]) for r in rows) == sorted(
        (b, a) for b in (4000, 100000) for a in ("native", "ring", "tree", "cerar"))
    for r in rows:
        assert r["max_error"] < (1e-2 if r["algorithm"] == "cerar" else 1e-6), r
        assert r["time_s"] > 0 and r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])    # 2(N-1)/N = 1
        assert r["predicted_s"] > 0 and r["prediction_error"] == pytest.approx(r["predicted_s"] / r["time_s"] - 1)


def test_a_hostfile_without_mpi_is_refused_in_one_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    run = gradsync("bench", "--hostfile", str(hosts))
    assert run.returncode == 2 and "a hostfile is for --backend mpi" in run.stderr and run.stderr.count("\n") == 1
