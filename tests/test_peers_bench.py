"""benchmarks/peers.py (gradsync against Gloo, Open MPI and DeepSpeed on one host) and
benchmarks/dispatch.py: their checks, options and arithmetic; the launch itself under -m slow."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    """A benchmark script as a module, without putting benchmarks/ on the path for every test
    (peers_rank imports peers by name, so each is registered as it loads)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peers, peers_rank, dispatch = load("peers"), load("peers_rank"), load("dispatch")


def test_inputs_sum_exactly_in_float32_whatever_the_order():
    inputs = np.stack([peers_rank.pattern(r, 5000, 1).numpy() for r in range(5)]).astype(np.float64)
    assert np.abs(inputs).max() <= 64 and len({row.tobytes() for row in inputs}) == 5
    want = peers_rank.reference(5, 5000, 1).numpy()
    assert np.array_equal(want, inputs.sum(axis=0))
    assert np.array_equal(want, inputs[::-1].astype(np.float32).cumsum(axis=0)[-1])     # another order, in float32
    assert not np.array_equal(want, peers_rank.reference(5, 5000, 0).numpy())          # the variants differ


class FakeComm:
    """One rank of a world whose barrier is immediate; Abort ends it as MPI_Abort would."""
    rank, size = 1, 2

    def Barrier(self):
        pass

    def Abort(self, code):
        raise SystemExit(code)


def test_a_wrong_sum_ends_the_launch_naming_system_rank_and_element(capsys):
    want = torch.arange(8.0)
    out = want.clone()
    assert peers_rank.call_checked(FakeComm(), "mpi", lambda: None, out, want, "N = 2, 32 bytes") >= 0
    out[6] += 1
    with pytest.raises(SystemExit) as stop:
        peers_rank.call_checked(FakeComm(), "deepspeed", lambda: None, out, want, "N = 2, 32 bytes")
    assert stop.value.code == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("peers: WRONG RESULT from DeepSpeed shm at N = 2, 32 bytes, rank 1, element 6: "
                    "7.0 where the float64 sum of the inputs is 6.0")


def test_a_failed_call_ends_the_launch_at_once(capsys):
    def broken():
        raise RuntimeError("peer 0 is gone")
    with pytest.raises(SystemExit) as stop:
        peers_rank.call_checked(FakeComm(), "gradsync", broken, torch.zeros(2), torch.zeros(2), "N = 2, 8 bytes")
    assert stop.value.code == 4
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "peers: gradsync.all_reduce failed at N = 2, 8 bytes, rank 1: RuntimeError: peer 0 is gone"


@pytest.mark.parametrize("argv, names", [
    (["--workers", "1"], ["--workers", "at least 2"]),
    (["--workers", "2,x"], ["'x'", "whole number"]),
    (["--sizes", "4KiB,6"], ["6 bytes", "float32"]),
    (["--sizes", "4Kbit"], ["4Kbit", "bytes"]),
    (["--systems", "gloo,nccl"], ["'nccl'", "gloo, mpi, deepspeed, gradsync, backend"]),
    (["--launches", "0"], ["--launches 0", "at least 1"]),
    (["--timeout", "0"], ["--timeout", "> 0"]),
    (["--out", "/no/such/folder/r.json"], ["/no/such/folder"]),
])
def test_bad_options_are_one_line_and_exit_2(argv, names, capsys):
    with pytest.raises(SystemExit) as stop:
        peers.parse(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert all(name in err for name in names), err


def test_options_read_as_given():
    args = peers.parse(["--workers", "2,4", "--sizes", "4KiB,64MiB", "--systems", "mpi,gloo,mpi"])
    assert args.workers == [2, 4] and args.sizes == [4096, 64 * 2**20] and args.systems == ["mpi", "gloo"]


def launch(sizes):
    """A launch's results as peers_rank writes them: sizes -> system -> seconds."""
    return {"sizes": [{"bytes": b, "calls": 5, "median_s": t} for b, t in sizes.items()]}


def test_figures_are_medians_over_launches_and_ratios_to_the_best_peer():
    runs = [launch({4096: {"gloo": 4e-4, "mpi": 5e-6, "gradsync": 6e-5}}),
            launch({4096: {"gloo": 3e-4, "mpi": 7e-6, "gradsync": 2e-5}}),
            launch({4096: {"gloo": 5e-4, "mpi": 6e-6, "gradsync": 3e-5}})]
    [row] = peers.summarize(runs, ["gloo", "mpi", "gradsync"])
    assert row["median_us"] == pytest.approx({"gloo": 400, "mpi": 6, "gradsync": 30})
    assert row["per_launch_us"]["mpi"] == pytest.approx([5, 7, 6])
    assert row["best_peer"] == "mpi" and row["gradsync_over_best_peer"] == pytest.approx(5.0)
    text = peers.table(2, [row], ["gloo", "mpi", "gradsync"], 1)
    assert text.splitlines()[-1] == "| 4 KiB | 400 | 6.0 | 30 | 5.00x (Open MPI) |"


def test_deepspeed_is_skipped_with_one_line_saying_why(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None if name == "deepspeed" else real(name))
    assert peers.deepspeed_op(10) == ("", "skipped: the deepspeed package is not installed (pip install -e '.[bench]')")
    monkeypatch.setattr(peers.importlib.util, "find_spec", real)
    if real("deepspeed") is None:
        return
    failing = tmp_path / "build.py"
    failing.write_text("import sys; sys.exit('error: command g++ not found')")
    monkeypatch.setattr(peers, "RANK_SCRIPT", failing)
    assert peers.deepspeed_op(60) == ("", "skipped: its op did not build (error: command g++ not found)")


def test_dispatch_options_and_the_do_nothing_group(capsys):
    with pytest.raises(SystemExit) as stop:
        dispatch.parse(["--repetitions", "0"])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == \
        "dispatch.py: error: --repetitions 0: expected at least 1"
    t = torch.ones(3)
    assert dispatch.NothingGroup(0, 1).allreduce([t]).get_future().wait() == [t]


needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
                               reason="Open MPI (mpirun) and mpi4py are needed")


@pytest.mark.slow
@needs_mpi
def test_one_launch_runs_every_system_checked(tmp_path):
    out = tmp_path / "peers.json"
    run = subprocess.run([sys.executable, str(BENCHMARKS / "peers.py"), "--workers", "2", "--sizes", "4KiB,1MiB",
                          "--launches", "1", "--calls", "3", "--warmup", "1", "--timeout", "300",
                          "--systems", "gloo,mpi,gradsync,backend", "--out", str(out)],
                         capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["workers"]["2"]["sizes"]
    assert [r["bytes"] for r in rows] == [4096, 2**20]
    for row in rows:
        assert set(row["median_us"]) == {"gloo", "mpi", "gradsync", "backend"}
        assert all(v > 0 for v in row["median_us"].values())
        best = min(row["median_us"][p] for p in ("gloo", "mpi"))
        assert row["gradsync_over_best_peer"] == pytest.approx(row["median_us"]["gradsync"] / best)
    assert "| 1 MiB |" in run.stdout
