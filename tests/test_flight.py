"""The flight recorder and ``gradsync doctor``: after a killed worker or on SIGUSR1, the records of
all ranks say who stopped first and where each rank was."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import gradsync
from gradsync.tools.doctor import diagnose, read
from gradsync.errors import ConfigError
from gradsync.runtime import flight
from gradsync.tools.launch import run


def killed_at(rank, workers, directory, victim, call):
    """All-reduce in a loop; ``victim`` SIGKILLs itself before its ``call``-th all-reduce."""
    flight.configure(directory)
    for k in range(1, 30):
        if rank == victim and k == call:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            gradsync.all_reduce(torch.ones(1024), algorithm="ring", timeout=10.0)
        except gradsync.PeerError as exc:
            return {"failed_call": k, "peer": exc.peer}
    return {"failed_call": None}


def gradsync_cli(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=120)


# 13 s: with the slow ones, to keep the default run under its 10 minutes
@pytest.mark.slow
def test_after_a_killed_worker_doctor_names_the_dead_rank_and_the_collective_in_flight(tmp_path):
    workers, victim, call = 4, 2, 6
    results = run(killed_at, workers, str(tmp_path), victim, call, timeout=60, tolerate=True)
    survivors = [r for r in range(workers) if r != victim]
    assert all(results[r]["failed_call"] == call for r in survivors), results
    assert sorted(p.name for p in tmp_path.glob("rank*.json")) == [f"rank{r}.json" for r in survivors]
    records = read(tmp_path)
    for record in records:
        entries = record["collectives"]
        assert [e["sequence"] for e in entries] == list(range(1, call + 1))
        assert all(e["phase"] == "done" for e in entries[:-1]) and entries[-1]["phase"] == "failed"
        assert entries[-1]["error"].startswith("PeerError") and record["reason"] == "PeerError"
    out = diagnose(records)
    assert out["first"] == victim and out["silent"] == [victim]
    assert out["collective"]["sequence"] == call and out["collective"]["algorithm"] == "ring"
    assert out["collective"]["bytes"] == 4096 and out["collective"]["dtype"] == "float32"
    text = out["paragraph"]
    assert text.startswith(f"Rank {victim} stopped first: it wrote no flight record")
    assert f"collective #{call} (ring, 4 KiB float32)" in text
    cli = gradsync_cli("doctor", str(tmp_path))
    assert cli.returncode == 0 and cli.stdout.strip() == text


def test_sigusr1_writes_the_record_of_a_hung_collective(tmp_path):
    script = textwrap.dedent(f"""
        import time, torch
        from gradsync.runtime import flight
        from gradsync.runtime.prepare import prepare
        from gradsync.runtime.transport import MemoryTransport
        flight.configure({str(tmp_path)!r})
        a, b = MemoryTransport.group(2)
        x = torch.ones(1000)
        print("ready", flush=True)
        prepare(x, "tree", "sum", a, time.monotonic() + 60, check=False).start(True).wait()   # rank 1 never comes
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        assert child.poll() is None
        child.send_signal(signal.SIGUSR1)
        path = tmp_path / "rank0.json"
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert child.poll() is None                      # the signal wrote a record and did not kill it
        record = json.loads(path.read_text())
    finally:
        child.kill()
        child.wait()
    assert record["reason"] == "SIGUSR1" and record["size"] == 2
    (entry,) = record["collectives"]
    assert entry["phase"] == "run" and entry["algorithm"] == "tree" and entry["ended"] is None
    out = diagnose([record])
    assert out["first"] == 1 and "wrote no flight record, while every other rank did" in out["paragraph"]


def entry(sequence, round_, phase="run", error=None, peer=None):
    return {"sequence": sequence, "algorithm": "halving_doubling", "bytes": 1 << 20, "dtype": "float32",
            "rounds": 4, "phase": phase, "round": round_, "started": float(sequence), "ended": None,
            "error": error, "error_peer": peer, "waiting_on": None}


def test_with_every_record_present_the_rank_furthest_behind_stopped_first():
    records = [{"rank": r, "size": 3, "reason": "SIGUSR1",
                "collectives": [entry(s, 3, "done") for s in range(1, 5)] + [entry(5, rnd)]}
               for r, rnd in ((0, 2), (2, 1))]
    records.append({"rank": 1, "size": 3, "reason": "SIGUSR1",
                    "collectives": [entry(s, 3, "done") for s in range(1, 4)] + [entry(4, 0)]})
    out = diagnose(records)
    assert out["first"] == 1 and out["silent"] == []
    assert "Rank 1 stopped first: it was furthest behind" in out["paragraph"]
    assert "The collective in flight was collective #5 (halving_doubling, 1 MiB float32)." in out["paragraph"]
    assert "rank 1 was in round 0 of 0-3 of collective #4" in out["paragraph"]
    assert "rank 0 was in round 2 of 0-3 of it; rank 1" in out["paragraph"]
    assert "rank 2 was in round 1 of 0-3 of it (records written on SIGUSR1)." in out["paragraph"]
    assert out["collective"]["sequence"] == 5


def test_the_recorder_keeps_the_last_64():
    from thread_groups import run_group

    for k in range(40):            # 80 collectives: 2 ranks, each a thread of this process
        run_group([torch.full((3,), float(k)), torch.ones(3)], "ring" if k % 2 else "tree")
    entries = flight.RECORDER.entries()
    assert len(entries) == flight.LIMIT and all(e["phase"] == "done" for e in entries)
    assert [e["algorithm"] for e in entries[-4:]] == ["tree", "tree", "ring", "ring"]


@pytest.mark.parametrize("make, needle", [
    (lambda p: p / "missing", "no directory"),
    (lambda p: p, "no flight records"),
])
def test_doctor_refuses_a_directory_without_records_in_one_line(tmp_path, make, needle):
    with pytest.raises(ConfigError, match=needle):
        read(make(tmp_path))
    cli = gradsync_cli("doctor", str(make(tmp_path)))
    assert cli.returncode == 2 and needle in cli.stderr and cli.stderr.count("\n") == 1
