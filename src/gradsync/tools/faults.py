"""Fault injection: kill one worker with SIGKILL at a random moment of a stream of all-reduces
and record what every survivor saw.

Each trial starts N workers that all-reduce small integers in float32 (sums are exact, so any
wrong result shows) with sizes drawn from a shared seed. One victim kills itself from a timer
thread at a random time, recording the instant first. Survivors must raise PeerError naming
the victim within the timeout plus 2 s; none may hang or return a wrong sum.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..algorithms import names
from ..errors import GradsyncError, PeerError
from ..runtime.api import all_reduce
from .launch import run

SIZES = (1, 100, 4096, 65536, 1 << 20)


def _victim_timer(after: float, record: str):
    def kill():
        Path(record).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    timer = threading.Timer(after, kill)
    timer.daemon = True
    timer.start()


def worker(rank, workers, victim, kill_after, algorithm, timeout, seed, record, transport="gloo"):
    torch.set_num_threads(1)
    sizes = random.Random(seed)
    if rank == victim:
        _victim_timer(kill_after, record)
    completed = wrong = 0
    try:
        for _ in range(100000):
            n = sizes.choice(SIZES)
            base = (torch.arange(n) % 7).float()
            x = base + rank
            all_reduce(x, algorithm=algorithm, timeout=timeout, transport=transport)
            wrong += int(not torch.equal(x, base * workers + sum(range(workers))))
            completed += 1
        return {"status": "finished", "completed": completed, "wrong": wrong}
    except PeerError as exc:
        return {"status": "peer_error", "peer": exc.peer, "at": time.time(), "message": str(exc),
                "completed": completed, "wrong": wrong}


@dataclass
class Trial:
    workers: int
    victim: int
    algorithm: str
    detection_s: list        # per survivor: from the kill to its PeerError
    named_victim: int        # survivors whose PeerError named the victim
    survivors: int
    hangs: int
    wrong: int
    errors: list
    messages: list           # each survivor's PeerError, for diagnosing misnamed failures
    segments_left: int = 0   # shared-memory files of this user in /dev/shm after the trial


def trial(workers: int, victim: int, algorithm: str, kill_after: float, timeout: float, seed: int,
          transport: str = "gloo") -> Trial:
    before = _segments()
    with tempfile.TemporaryDirectory() as tmp:
        record = str(Path(tmp) / "killed_at")
        results = run(worker, workers, victim, kill_after, algorithm, timeout, seed, record, transport,
                      timeout=timeout + kill_after + 30, tolerate=True)
        killed_at = float(Path(record).read_text()) if Path(record).exists() else None
    detection, named, hangs, wrong, errors, messages = [], 0, 0, 0, [], []
    for rank, r in enumerate(results):
        if rank == victim:
            continue
        if isinstance(r, GradsyncError):
            hangs += "hung" in str(r) or "timeout" in str(r)
            errors.append(str(r))
            continue
        wrong += r["wrong"]
        if r["status"] == "peer_error":
            named += r["peer"] == victim
            messages.append(r["message"])
            if killed_at is not None:
                detection.append(r["at"] - killed_at)
        else:
            errors.append(f"rank {rank} finished without seeing the failure")
    return Trial(workers, victim, algorithm, detection, named, workers - 1, hangs, wrong, errors, messages,
                 len(_segments() - before))


def _segments() -> set[str]:
    from ..runtime.transport.shm import PREFIX, SHM_DIR

    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{os.getuid()}-")}
    except OSError:
        return set()


def campaign(trials: int, timeout: float = 3.0, seed: int = 0, algorithms=None, workers=(3, 4, 5, 6),
             transport: str = "gloo") -> dict:
    """Run ``trials`` random kill trials (over ``algorithms``, default every exact one) over
    ``transport``; return them and a summary."""
    algorithms = names(exact=True) if algorithms is None else algorithms
    rng = random.Random(seed)
    out = []
    for i in range(trials):
        n = rng.choice(workers)
        t = trial(n, rng.randrange(n), algorithms[i % len(algorithms)], rng.uniform(0.5, 2.0), timeout,
                  rng.randrange(1 << 30), transport)
        out.append(t)
    detections = sorted(d for t in out for d in t.detection_s)

    def pct(q):
        return detections[min(len(detections) - 1, int(q * len(detections)))] if detections else None

    summary = {"trials": trials, "timeout_s": timeout, "survivors": sum(t.survivors for t in out),
               "named_victim": sum(t.named_victim for t in out), "hangs": sum(t.hangs for t in out),
               "wrong_results": sum(t.wrong for t in out), "detection_p50_s": pct(0.5),
               "detection_p99_s": pct(0.99), "detection_max_s": detections[-1] if detections else None,
               "transport": transport, "segments_left": sum(t.segments_left for t in out),
               "other_errors": [e for t in out for e in t.errors][:20]}
    return {"summary": summary, "trials": [t.__dict__ for t in out]}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Kill-worker fault injection for gradsync.all_reduce")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = campaign(args.trials, args.timeout)
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
