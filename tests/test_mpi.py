"""The MPI engine under mpirun (Open MPI): every algorithm against the exact sum."""

import json
import os
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


TRACED = """
import sys, torch
from mpi4py import MPI
from gradsync.integrations.mpi import all_reduce
from gradsync.runtime.tracing import Trace
t = Trace()
for _ in range(2):
    all_reduce(torch.ones(999), algorithm="halving_doubling", trace=t)
t.save(f"{sys.argv[1]}/rank{MPI.COMM_WORLD.Get_rank()}.json")
"""


@pytest.mark.slow
def test_traces_over_mpi_merge_into_one_on_rank_0s_clock(tmp_path):
    import os

    from gradsync import algorithms
    from gradsync.tools import trace_files as trace
    from gradsync.model.simulate import simulate
    from gradsync.model.topology import preset

    (tmp_path / "traced.py").write_text(TRACED)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
                          sys.executable, str(tmp_path / "traced.py"), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = trace.merge([trace.load(tmp_path / f"rank{r}.json") for r in range(3)])
    expected = trace.from_simulation(simulate(algorithms.build("halving_doubling", 3, 999), preset("ethernet", 3)))
    assert trace.structure(doc, 1) == trace.structure(expected)
    for info in doc["otherData"]["gradsync"]["ranks"]:     # one machine, one clock: Cristian's bound
        assert abs(info["offset_ns"]) <= info["rtt_ns"] / 2 + 1000


@pytest.mark.slow
def test_bench_takes_a_hostfile_and_groups_ranks_by_machine(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=4\n")
    out = subprocess.run([sys.executable, "-m", "gradsync", "bench", "--backend", "mpi", "--hostfile", str(hosts),
                          "--workers", "4", "--sizes", "64KB", "--iters", "2", "--algorithms", "hierarchical",
                          "--format", "json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert [r["algorithm"] for r in rows] == ["native", "hierarchical"] and all(r["max_error"] < 1e-6 for r in rows)


@pytest.mark.slow
def test_bench_inside_an_mpirun_runs_on_its_ranks_and_reports_once():
    out = subprocess.run(["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
                          sys.executable, "-m", "gradsync", "bench", "--backend", "mpi", "--sizes", "64KB",
                          "--iters", "2", "--algorithms", "ring,tree", "--format", "json"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)                                   # one document: rank 0 alone reports
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert {r["algorithm"] for r in rows} == {"native", "ring", "tree"}
    assert all(r["workers"] == 3 and r["max_error"] < 1e-6 for r in rows)     # against the float64 sum
