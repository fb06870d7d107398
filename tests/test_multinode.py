"""Several machines, emulated: each a network namespace with its own host name, two ranks per
machine started by torchrun, the machines joined by 1 Gbit/s shaped links. Every command runs
as one job across them; the hierarchical all-reduce groups by machine (root needed)."""

import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys

import pytest

from gradsync.tools.links import SlowLinks
from gradsync.training import elastic
from gradsync.training.train import TrainConfig

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="network namespaces need root")


def _torchrun(net, args, per_node=2, timeout=90):
    """Start torchrun on every emulated machine, each under its own host name; return outputs."""
    procs = []
    for node, ns in enumerate(net.namespaces):
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
               f'hostname machine{node} && exec "$0" "$@"', sys.executable, "-m", "torch.distributed.run",
               "--nnodes", str(net.machines), "--node-rank", str(node), "--nproc-per-node", str(per_node),
               "--master-addr", net.addresses[0], "--master-port", str(net.port),
               "-m", "gradsync", *args]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": net.interface, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      start_new_session=True))
    outs = _outputs(procs, timeout)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    return [out for out, _ in outs]


def _outputs(procs, timeout):
    """Every process's (stdout, stderr); on a timeout none of them, nor their workers (each
    started in its own session), is left running for the next test."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@needs_root
@pytest.mark.slow
def test_bench_across_two_machines_runs_every_algorithm_exactly_as_one_job():
    names = "ring,hierarchical,tree,sharded,halving_doubling,central"
    with SlowLinks(4, "1Gbit", per_node=2) as net:
        first, second = _torchrun(net, ["bench", "--algorithms", names, "--sizes", "256KB", "--iters", "2",
                                        "--format", "json"])
    assert second.strip() == ""                                     # rank 0, on the first machine, reports
    rows = json.loads(first)["rows"] if first.strip().startswith("{") else json.loads(first)
    seen = {r["algorithm"] for r in rows}
    assert set(names.split(",")) <= seen
    for r in rows:
        assert r["workers"] == 4
        assert r["max_error"] <= 1e-6, r                             # against the float64 sum of the inputs


@needs_root
@pytest.mark.slow
def test_train_across_two_machines_is_one_job_reported_once():
    with SlowLinks(4, "1Gbit", per_node=2) as net:
        first, second = _torchrun(net, ["train", "--epochs", "1", "--algorithm", "hierarchical", "--format", "json"])
    assert second.strip() == ""
    result = json.loads(first)
    assert result["workers"] == 4 and result["launcher"] == "torchrun" and len(result["history"]) == 1
    assert result["history"][0]["test_accuracy"] > 0.5


def _start_store():
    proc = subprocess.Popen([sys.executable, "-m", "gradsync", "store", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "listening on 127.0.0.1:" in line, proc.stderr.read()
    return proc, int(line.split("127.0.0.1:")[1].split()[0])


def test_the_store_serves_clients_and_outlives_them():
    import datetime

    import torch.distributed as dist

    proc, port = _start_store()
    try:
        a = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
        a.set("machine0", "up")
        del a                                                       # a client leaves: the store stays
        b = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
        assert b.get("machine0") == b"up"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_torchrun_agents_meet_at_a_separate_store_that_none_of_them_hosts():
    proc, port = _start_store()
    try:
        agents = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=false",
             "--rdzv-id", "gradsync-test", "-m", "gradsync", "bench", "--algorithms", "ring", "--sizes", "4KB",
             "--iters", "1", "--format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}) for _ in range(2)]
        outs = _outputs(agents, 120)
        assert all(a.returncode == 0 for a in agents), [err[-1500:] for _, err in outs]
        reports = [out for out, _ in outs if out.strip()]
        assert len(reports) == 1 and "ring" in reports[0]              # one job, reported once
    finally:
        proc.terminate()
        proc.wait(timeout=10)


ELASTIC = TrainConfig(model="mlp", epochs=12, batch_size=32, timeout=10.0)
ELASTIC_STEPS = ELASTIC.epochs * (1438 // 32)


def _recovered_from_committed_steps(result):
    killed_at = result["kills"][0]["step"]
    resumed = [e["step"] for e in result["events"][1:]]
    # nothing committed is lost (each recovery starts at or after the step committed at the kill)
    # and nothing is applied twice (steps never go backwards)
    return resumed and resumed[0] >= killed_at and resumed == sorted(resumed)


@needs_root
@pytest.mark.slow
def test_elastic_training_across_two_machines_survives_a_killed_worker(tmp_path):
    with SlowLinks(4, "1Gbit", per_node=2) as net:
        result = elastic.train(4, ELASTIC, min_workers=2, kill_every=1.0, network=net, victims=[("worker", 1)],
                               workdir=tmp_path, timeout=85)
    assert result["final"]["step"] == ELASTIC_STEPS and result["machines"] == 2
    assert len(result["kills"]) == 1 and result["kills"][0]["recovered_s"] is not None
    assert _recovered_from_committed_steps(result)
    assert result["history"][-1]["test_accuracy"] > 0.9


@needs_root
@pytest.mark.slow
def test_elastic_training_survives_losing_the_first_machine_when_the_store_is_outside_it(tmp_path):
    with SlowLinks(2, "1Gbit") as net:
        result = elastic.train(2, ELASTIC, min_workers=1, kill_every=1.0, network=net, victims=[("machine", 0)],
                               rejoin_after=None, workdir=tmp_path, timeout=85)
    assert result["final"]["step"] == ELASTIC_STEPS and len(result["kills"]) == 1
    assert _recovered_from_committed_steps(result)
    assert result["events"][-1]["world_size"] == 1 == result["final"]["world_size"]   # the second machine alone
    assert result["history"][-1]["test_accuracy"] > 0.9


@needs_root
@pytest.mark.slow
def test_calibrate_across_two_machines_fits_inside_and_between_apart(tmp_path):
    from gradsync.model.topology import load

    out = tmp_path / "two-machines.json"
    with SlowLinks(4, "1Gbit", per_node=2) as net:
        first, second = _torchrun(net, ["calibrate", "--out", str(out), "--repeats", "3", "--format", "json"])
    assert second.strip() == ""                                     # rank 0 reports and writes
    fits = json.loads(first)
    assert (fits["machines"], fits["local_size"]) == (2, 2)
    link = net.rate                                                 # bytes/s the tbf lets through each way
    # the link's rate as the runtime's ring moves it: 0.70-0.95 of the link here, idle; before
    # receives were posted first 0.62-0.70, and 0.51 on a loaded CI machine (docs/runtime.md)
    assert 0.45 * link < fits["across"]["bandwidth_Bps"] < 1.2 * link
    assert fits["inside"]["bandwidth_Bps"] > 2 * link               # loopback inside a machine
    topology = load(out)
    assert topology.machine_size() == 2                             # the hierarchical all-reduce groups by it
