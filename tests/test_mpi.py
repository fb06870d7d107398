"""The MPI engine under mpirun (Open MPI): every algorithm against the exact sum."""

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is not installed")


def test_bench_over_mpi_sums_exactly():
    run = subprocess.run([sys.executable, "-m", "gradsync", "bench", "--backend", "mpi", "--workers", "3",
                          "--sizes", "1KB,100KB", "--iters", "2", "--algorithms",
                          "ring,tree,halving_doubling,sharded,central,host,cerar", "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    assert {r["algorithm"] for r in rows} == {"native", "ring", "tree", "halving_doubling", "sharded", "central",
                                              "host", "cerar"}
    for r in rows:
        assert r["max_error"] < (1e-2 if r["algorithm"] == "cerar" else 1e-6), r
        assert r["workers"] == 3 and r["time_s"] > 0
