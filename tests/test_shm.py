"""The shared-memory transport between local processes: exact sums against numpy's float64,
failures named, nothing left in /dev/shm, and how it is chosen."""

import json
import os
import subprocess
import sys

import pytest

import shm_bodies as bodies
from gradsync import ConfigError
from gradsync.algorithms import names
from gradsync.tools.launch import run
from gradsync.runtime.transport import for_group
from gradsync.runtime.transport.shm import PREFIX, SHM_DIR, layout, sweep

TOLERANCE = {"torch.float64": 1e-13, "torch.float32": 1e-6, "torch.int32": 0.0}


def segments() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{os.getuid()}-")}


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])   # 4: 25-30 s here
def test_every_exact_algorithm_sums_exactly_over_shared_memory(workers):
    before = segments()
    results = run(bodies.exact_sums, workers, timeout=240)
    for r in results:
        assert r.pop("transport") == "ShmTransport"
        assert len(r) == len(names(exact=True)) * (3 * len(bodies.LENGTHS) + 1)   # every algorithm, dtype, length
        for (algorithm, dtype, n), error in r.items():
            assert error <= TOLERANCE[dtype], (algorithm, dtype, n, error)
    assert segments() <= before                                    # unlinked once every rank had mapped it


def test_auto_picks_shared_memory_between_local_processes():
    for r in run(bodies.auto_picks, 3):
        assert r == {"chosen": "ShmTransport", "sum": [6.0] * 5, "shared": True}


def test_a_killed_rank_is_named_on_every_survivor_and_no_segment_is_left():
    timeout, before = 3.0, segments()
    results = run(bodies.killed_rank, 4, 2, timeout, timeout=60, tolerate=True)
    assert "died" in str(results[2])                              # the victim's own slot: it was killed
    for r in results[:2] + results[3:]:
        assert r["error"] and r["peer"] == 2, r
        assert r["seconds"] <= timeout + 2, r
    assert segments() <= before


@pytest.mark.slow
def test_a_stalled_rank_is_named_not_the_neighbour_waiting_for_it():
    timeout = 2.0
    results = run(bodies.stalled, 3, timeout, timeout=60)
    for r in results[1:]:
        assert r["error"] and "did not answer before the timeout" in r["error"], r
        assert r["peer"] == 0 and r["seconds"] <= timeout + 2, r


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["one_shot", "ring"])      # the shared buffers, the channels
def test_a_rank_stopped_while_it_waited_is_named_never_the_survivor_itself(algorithm):
    # its word still says whom it waited for, so the survivors' waits can seem to close on
    # themselves (0 waits for 2, the stopped 2 for 0): a random campaign's rank 0 named itself
    timeout = 2.0
    results = run(bodies.stopped_while_waiting, 3, timeout, 2, algorithm, timeout=60)
    assert results[2] == {"stopped": True}
    for r in results[:2]:
        assert r["error"] and "rank 2 did not answer before the timeout" in r["error"], r
        assert r["peer"] == 2 and r["seconds"] <= timeout + 2, r


@pytest.mark.slow
def test_a_rank_missing_at_set_up_is_named():
    timeout = 2.0
    results = run(bodies.absent_at_setup, 3, timeout, timeout=60, tolerate=True)
    for r in results[:2]:
        assert r["error"] and r["peer"] == 2 and r["seconds"] <= timeout + 2, r


def test_sweep_removes_segments_whose_creator_died(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{PREFIX}{os.getuid()}-{dead.stdout.strip()}-{'ab' * 16}"
    live = tmp_path / f"{PREFIX}{os.getuid()}-{os.getpid()}-{'cd' * 16}"
    other = tmp_path / "unrelated"
    for f in (stale, live, other):
        f.write_bytes(b"x")
    assert sweep(str(tmp_path)) == [stale.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_layout_stays_within_its_budget():
    for size in (2, 4, 8, 16, 64, 256):
        slot_bytes, slots = layout(size)
        assert slot_bytes % 4096 == 0 and slots >= 2
        assert size * (size - 1) * slots * slot_bytes <= max(512 << 20, size * (size - 1) * 2 * (64 << 10))


def test_an_unknown_transport_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="transport must be one of gloo, shm, auto, got 'tcp'"):
        for_group("tcp")
    with pytest.raises(ConfigError, match="gradsync.integrations.mpi.all_reduce"):
        for_group("mpi")


def gradsync_cli(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=300)


def test_bench_cli_refuses_a_bad_transport_in_one_line():
    out = gradsync_cli("bench", "--transport", "tcp")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "'tcp' is not one of 'gloo', 'mpi', 'shm', 'auto'" in out.stderr


def test_bench_cli_runs_gradsync_rows_over_shared_memory():
    out = gradsync_cli("bench", "-n", "2", "--algorithms", "ring", "--sizes", "4KB,3MB", "--iters", "3",
                       "--transport", "shm", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["algorithm"], r["transport"]) for r in rows] == [("native", "native"), ("ring", "shm")] * 2
    assert all(r["max_error"] < 1e-6 for r in rows)


@pytest.mark.slow
def test_training_over_shared_memory_matches_one_worker_on_the_whole_batch():
    from gradsync.training.train import TrainConfig, train

    one = train(1, TrainConfig(algorithm="ring", epochs=2, batch_size=64))["history"]
    two = train(2, TrainConfig(algorithm="ring", epochs=2, batch_size=64, transport="shm"))["history"]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["replica_max_diff"] == 0.0
    with pytest.raises(ConfigError, match="transport must be one of gloo, shm, auto, got 'tcp'"):
        TrainConfig(transport="tcp").check(2)


@pytest.mark.slow
def test_kill_trials_over_shared_memory_name_the_victim_and_leave_no_segment():
    from gradsync.tools.faults import campaign

    timeout = 3.0
    summary = campaign(3, timeout=timeout, seed=11, transport="shm")["summary"]
    assert summary["hangs"] == 0 and summary["wrong_results"] == 0, summary
    assert summary["named_victim"] == summary["survivors"] > 0, summary
    assert summary["detection_max_s"] <= timeout + 2 and not summary["other_errors"], summary
    assert summary["segments_left"] == 0, summary


@pytest.mark.slow   # a multi-process run of several seconds; CI runs it with -m slow
def test_a_group_spanning_hosts_sums_exactly_over_shared_memory_inside_each():
    """Two emulated machines of two ranks (GRADSYNC_HOST) without a launcher variable: "auto"
    picks the mixed transport, the ranks learn local_size = 2 from their hosts, and ring and
    hierarchical sum exactly, the REDUCE bytes between ranks of one machine added from the channel."""
    before = segments()
    results = run(bodies.mixed_sums, 4, 2, timeout=240)
    for rank, r in enumerate(results):
        assert r["transport"] == "MixedTransport" and r["local_size"] == 2
        assert r["host_ranks"] == [0, 1] if rank < 2 else [2, 3]
        assert r["added_in_place"] > 0
        assert len(r["errors"]) == 2 * sum(len(n) for n in bodies.MIXED_LENGTHS.values())
        for (algorithm, dtype, n), error in r["errors"].items():
            assert error <= TOLERANCE[dtype], (algorithm, dtype, n, error)
    assert segments() <= before


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 3])
def test_a_killed_rank_of_a_group_spanning_hosts_is_named_on_both(victim):
    timeout, before = 3.0, segments()
    results = run(bodies.mixed_killed, 4, 2, victim, timeout, timeout=60, tolerate=True)
    assert "died" in str(results[victim])
    for r in results[:victim] + results[victim + 1:]:             # its own host's survivor and the other host's
        assert r["error"] and r["peer"] == victim, r
        assert r["seconds"] <= timeout + 2, r
    assert segments() <= before


@pytest.mark.slow
def test_bench_default_list_shows_the_shared_buffer_all_reduce_beside_the_engines_rows():
    out = gradsync_cli("bench", "-n", "2", "--sizes", "4KB", "--iters", "2", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    pairs = [(r["algorithm"], r["transport"]) for r in rows]
    assert pairs[0] == ("native", "native") and pairs[-1] == ("auto", "shm")
    assert ("ring", "gloo") in pairs and all(t == "gloo" for _, t in pairs[1:-1])
    assert all(r["max_error"] < (1e-2 if r["algorithm"] == "cerar" else 1e-6) for r in rows)
    table = gradsync_cli("bench", "-n", "2", "--sizes", "4KB", "--iters", "1", "--algorithms", "ring")
    assert table.returncode == 0 and " shm " not in table.stdout and "transport" in table.stdout


@pytest.mark.slow
def test_a_stalled_rank_of_a_group_spanning_hosts_is_named_on_both():
    timeout, sleeper = 2.0, 3
    results = run(bodies.mixed_stalled, 4, 2, sleeper, timeout, timeout=60)
    for r in results[:sleeper]:
        assert r["error"] and r["peer"] == sleeper and r["seconds"] <= timeout + 2, r
