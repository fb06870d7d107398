"""Chrome traces of measured and simulated collectives: valid trace JSON, the rounds a schedule
says in the order it says, one clock for all ranks, and one structure for both kinds."""

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from gradsync import algorithms
from gradsync.tools import trace_files as trace
from gradsync.errors import ConfigError
from gradsync.tools import bench
from gradsync.runtime.prepare import prepare
from gradsync.tools.launch import run
from gradsync.runtime.tracing import Trace
from gradsync.runtime.transport import MemoryTransport
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset


def traced_group(workers, algorithm, elements, calls=1, **options):
    """Every rank a thread over the in-memory transport; each rank's trace, merged."""
    transports = MemoryTransport.group(workers, seed=3)
    traces = [Trace() for _ in range(workers)]
    errors = []

    def rank(r):
        try:
            for _ in range(calls):
                x = torch.full((elements,), float(r + 1))
                prepare(x, algorithm, "sum", transports[r], time.monotonic() + 30, options=options,
                        trace=traces[r]).start(True).wait()
                assert torch.allclose(x, torch.full_like(x, workers * (workers + 1) / 2), rtol=1e-2)   # CERAR: approximate
        except Exception as exc:       # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return trace.merge([t.to_dict() for t in traces])


@pytest.mark.slow   # a multi-process run of several seconds; CI runs it with -m slow
def test_a_4_rank_ring_bench_trace_holds_2n_minus_1_rounds_per_rank_in_order():
    workers, nbytes = 4, 4096
    results = run(bench.worker, workers, [nbytes], ["ring"], 2, "float32", 30.0, {}, False, None, True, timeout=120)
    doc = trace.merge([r["trace"] for r in results])
    trace.validate(json.loads(json.dumps(doc)))          # as written to a file
    assert results[0]["rows"][1]["algorithm"] == "ring" and results[0]["rows"][1]["max_error"] < 1e-6
    by_rank = {}
    for c in trace.collectives(doc):
        by_rank.setdefault(c["pid"], []).append(c)
    assert sorted(by_rank) == list(range(workers))
    chunk = nbytes // workers
    for rank, calls in by_rank.items():
        assert len(calls) == 3                             # one untimed and two timed calls
        for c in calls:
            assert c["args"]["algorithm"] == "ring" and c["args"]["bytes"] == nbytes
            rounds = c["rounds"]
            assert [r["args"]["round"] for r in rounds] == list(range(2 * (workers - 1)))
            starts = [r["ts"] for r in rounds]
            assert starts == sorted(starts)
            for r in rounds:        # each round: a chunk to the right, one from the left, added in the first N-1
                inside = [e for e in c["events"] if e["args"]["round"] == r["args"]["round"]]
                kinds = {(e["name"], e["args"]["peer"], e["args"]["bytes"]) for e in inside if e["name"] != "send wait"}
                expected = {("send", (rank + 1) % workers, chunk), ("recv wait", (rank - 1) % workers, chunk)}
                if r["args"]["round"] < workers - 1:
                    expected.add(("reduce", (rank - 1) % workers, chunk))
                assert kinds == expected
    # one clock: no rank can finish a ring all-reduce before every rank has started it
    for k in range(3):
        calls = [by_rank[r][k] for r in range(workers)]
        assert max(c["ts"] for c in calls) < min(c["ts"] + c["dur"] for c in calls)
    # Cristian's bound: the true offset is 0 between processes of one machine (one monotonic clock)
    for info in doc["otherData"]["gradsync"]["ranks"][1:]:
        assert abs(info["offset_ns"]) <= info["rtt_ns"] / 2 + 1000


@pytest.mark.parametrize("algorithm, workers, options", [
    ("ring", 4, {}), ("ring", 5, {}), ("tree", 5, {}), ("halving_doubling", 6, {}), ("sharded", 3, {}),
    ("central", 4, {}), ("cerar", 3, {"components": 6})])
def test_measured_and_simulated_traces_of_one_schedule_have_the_same_structure(algorithm, workers, options):
    measured = traced_group(workers, algorithm, 1001, **options)
    trace.validate(measured)
    schedule = algorithms.build(algorithm, workers, 1001, **options)
    simulated = trace.from_simulation(simulate(schedule, preset("ethernet", workers)))
    trace.validate(simulated)
    got, expected = trace.structure(measured), trace.structure(simulated)
    assert got == expected
    # and both say what the schedule moves: every transfer's bytes, sent and received
    t = schedule.transfers
    for rank, rounds in expected.items():
        sent = sum(b for _, kinds in rounds for kind, _, b in kinds if kind == "send")
        received = sum(b for _, kinds in rounds for kind, _, b in kinds if kind == "recv wait")
        assert sent == 4 * int(t["count"][t["src"] == rank].sum())
        assert received == 4 * int(t["count"][t["dst"] == rank].sum())


def test_a_simulated_trace_follows_the_simulator():
    schedule = algorithms.build("ring", 4, 1_000_000)
    result = simulate(schedule, preset("ethernet", 4))
    doc = trace.from_simulation(result)
    for c in trace.collectives(doc):
        assert c["dur"] * 1e-6 == pytest.approx(result.node_done[c["pid"]], rel=1e-9)
        rounds = c["rounds"]
        assert [r["args"]["round"] for r in rounds] == list(range(6))
        ends = [r["ts"] + r["dur"] for r in rounds]
        assert [r["ts"] for r in rounds[1:]] == pytest.approx(ends[:-1])      # no gap: the next round is posted
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    links = {e["name"] for e in counters}
    assert len(links) == len(np.flatnonzero(result.channel_bytes))
    values = np.array([e["args"]["utilisation"] for e in counters])
    assert values.min() >= 0 and values.max() == pytest.approx(1.0)     # one flow per link: it fills it


def test_tracing_several_collectives_keeps_them_apart_and_bounded():
    doc = traced_group(3, "ring", 10, calls=4)
    calls = trace.collectives(doc)
    assert len(calls) == 12 and all(len(c["rounds"]) == 4 for c in calls)
    small = Trace(limit=6)
    recorder = small.begin(0, {"algorithm": "ring"})
    for _ in range(10):
        recorder.event("send", 0, {"round": 0, "peer": 1, "bytes": 4})
    small.begin(0, {"algorithm": "tree"}).event("send", 0, {"round": 0, "peer": 1, "bytes": 4})
    names = [e["name"] for e in small.to_dict()["traceEvents"] if e["ph"] == "X"]
    assert small.dropped == 6 and names == ["all_reduce ring", "round 0"] + ["send"] * 5


@pytest.mark.parametrize("event, needle", [
    ({"ph": "B", "name": "a", "pid": 0, "tid": 0, "ts": 0}, "phase must be X, M or C"),
    ({"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0}, "dur must be a number"),
    ({"ph": "X", "name": "a", "pid": "0", "tid": 0, "ts": 0, "dur": 1}, "pid must be an integer"),
    ({"ph": "M", "name": "nickname", "pid": 0, "tid": 0, "args": {"name": "x"}}, "metadata must be one of"),
    ({"ph": "C", "name": "a", "pid": 0, "tid": 0, "ts": 1, "args": {"u": "high"}}, "numeric args"),
])
def test_validate_names_the_bad_event(event, needle):
    with pytest.raises(ConfigError, match=needle):
        trace.validate({"traceEvents": [event]})


def test_validate_refuses_slices_that_do_not_nest():
    ok = [trace.complete("a", "x", 0, 0, 10), trace.complete("b", "x", 0, 2, 3), trace.complete("c", "x", 0, 10, 5)]
    trace.validate({"traceEvents": ok})
    with pytest.raises(ConfigError, match="must nest"):
        trace.validate({"traceEvents": ok + [trace.complete("d", "x", 0, 4, 8)]})
    trace.validate({"traceEvents": ok + [trace.complete("d", "x", 0, 4, 8, tid=1)]})    # another thread


def test_compare_sets_measured_rounds_beside_simulated_ones():
    measured = traced_group(4, "ring", 1000, calls=3)
    simulated = trace.from_simulation(simulate(algorithms.build("ring", 4, 1000), preset("ethernet", 4)))
    out = trace.compare(measured, simulated)
    assert [r["round"] for r in out["rounds"]] == list(range(6))
    durations = [r["dur"] * 1e-6 for c in trace.collectives(measured) for r in c["rounds"] if r["args"]["round"] == 2]
    assert out["rounds"][2]["measured_s"] == pytest.approx(float(np.median(durations)))
    assert out["rounds"][2]["predicted_s"] == pytest.approx(float(simulated_round(simulated, 2)))
    gaps = [abs(r["gap_s"]) for r in out["rounds"]]
    assert out["largest_gap_round"] == int(np.argmax(gaps))
    other = trace.from_simulation(simulate(algorithms.build("tree", 4, 1000), preset("ethernet", 4)))
    with pytest.raises(ConfigError, match="holds no tree all-reduce of 4000 bytes; it holds ring of 4000 bytes"):
        trace.compare(measured, other)


def simulated_round(doc, r):
    return np.median([s["dur"] * 1e-6 for c in trace.collectives(doc) for s in c["rounds"] if s["args"]["round"] == r])


def gradsync(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=120)


def test_cli_writes_a_simulated_trace_and_refuses_a_bad_one(tmp_path):
    out = tmp_path / "sim.json"
    done = gradsync("simulate", "-a", "halving_doubling", "-t", "ethernet", "-n", "4", "-s", "64KB", "--trace", str(out))
    assert done.returncode == 0, done.stderr
    doc = trace.load(out)
    assert doc["otherData"]["gradsync"]["kind"] == "simulated"
    assert {c["pid"] for c in trace.collectives(doc)} == {0, 1, 2, 3}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": -1, "dur": 1}]}))
    refused = gradsync("trace", "compare", str(bad), str(out))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "bad.json" in refused.stderr and "ts must be a number >= 0" in refused.stderr
    merged = tmp_path / "m.json"
    assert gradsync("trace", "merge", str(out), str(out), "-o", str(merged)).returncode == 0
    assert len(trace.load(merged)["traceEvents"]) == 2 * len(doc["traceEvents"])


def test_a_rank_tracing_alone_gets_a_mismatch_not_a_hang():
    transports = MemoryTransport.group(2, seed=1)
    out = [None, None]

    def rank(r):
        try:
            for k in range(2):          # the second call: rank 0 traces, rank 1 does not
                traced = Trace() if (r == 0 and k == 1) else None
                prepare(torch.ones(10), "ring", "sum", transports[r], time.monotonic() + 10,
                        trace=traced).start(True).wait()
        except Exception as exc:       # noqa: BLE001 - the test looks at it
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for exc in out:
        assert type(exc).__name__ == "MismatchError" and "traced: rank(s) [0] have true" in str(exc)


def test_a_simulated_trace_too_large_to_write_is_refused_before_simulating():
    with pytest.raises(ConfigError, match="ring on 600 workers has 718800 \\(worker, round\\) steps, more than 250000"):
        trace.check_size(algorithms.build("ring", 600, 600))


@pytest.mark.slow
def test_a_training_trace_holds_every_bucket_and_the_bytes_the_meter_counts():
    from gradsync.training.train import TrainConfig, train

    from gradsync.training import data, models

    cfg = TrainConfig(algorithm="halving_doubling", epochs=1)
    result = train(2, cfg, trace=True)
    doc = result["trace"]
    trace.validate(doc)
    calls = trace.collectives(doc)
    by_rank = [[c for c in calls if c["pid"] == r] for r in range(2)]
    steps = len(list(data.batches(len(data.digits(cfg.seed).y_train), cfg.batch_size, 0, cfg.seed)))
    model_bytes = 4 * sum(p.numel() for p in models.build(cfg.model, cfg.seed).parameters())
    assert len(by_rank[0]) == len(by_rank[1]) == steps                # one bucket: the whole model is small
    assert all(c["args"]["bytes"] == model_bytes for c in calls)
    sent = sum(e["args"]["bytes"] for c in by_rank[0] for e in c["events"] if e["name"] == "send")
    assert sent == result["history"][0]["bytes_per_worker"]       # as the hook's meter counts from the schedule
