"""Groups created and destroyed: does a long-lived process keep what each gradsync group took?

One job of ``--workers`` ranks (2 or 4, each a process started here, meeting at a TCPStore this
launcher hosts, so that no rank's memory holds the store's keys). Each rank runs ``--cycles``
cycles of ``init_process_group("gradsync", store=PrefixStore(cycle), ...)``, one
``all_reduce`` (1 MiB, float32; its sum checked) and ``destroy_process_group()``. Every tenth
cycle the group has one rank more: a helper process (started by the launcher, its imports done
while the others run the cycles before) that joins the group and SIGKILLs itself at a random
moment from just before the all_reduce to 30 ms into it. The ranks then meet a rank that died
mid-collective, as a job whose peer dies does; each records its error (type, first line, the
``peer`` it named, seconds from the helper's death), destroys the group and carries on, as a
torchft-style trainer re-forming its group does. What it does not model: the survivors' own
ranks change (they keep theirs), and the failure of a rank of the long-lived job itself.

Every ``--every`` cycles each rank samples its resident memory (VmRSS), its mappings (lines of
/proc/self/maps, and those of /dev/shm files), its threads (``threading.active_count()`` and
/proc/self/task) and its open descriptors, after ``gc.collect()``, with what they are (the
threads' names, the descriptors' kinds, the /dev/shm files mapped) and how many gradsync and
torch objects live (a destroyed ``GradsyncGroup`` should not; what holds one is named). They
must stay flat: the table sets the first sample after warm-up (cycle ``--every``) against the
last. Before each cycle the ranks meet at the launcher's store, so that one held up by a
failed cycle is waited for.

    python benchmarks/group_churn.py --workers 4 --cycles 1000 --out docs/results/group_churn.json
    python benchmarks/group_churn.py --workers 2 --cycles 100 --every 10        # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ELEMENTS = 1 << 18                     # 1 MiB of float32
METRICS = ("rss_kb", "maps", "shm_maps", "threads", "tasks", "fds", "groups_alive")


def sample(cycle: int) -> dict:
    """This process's memory, mappings, threads and descriptors now, and what they are: the
    threads' names, the descriptors' kinds (socket, pipe, file...) and the /dev/shm files mapped."""
    gc.collect()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    shm = sorted({m.split()[-1] for m in maps if "/dev/shm/" in m})
    tasks = os.listdir("/proc/self/task")
    return {"cycle": cycle, "t": round(time.time(), 2), "rss_kb": rss, "maps": len(maps), "shm_maps": sum("/dev/shm/" in m for m in maps),
            "threads": threading.active_count(), "tasks": len(tasks), "fds": len(os.listdir("/proc/self/fd")),
            "task_names": dict(Counter(_read(f"/proc/self/task/{t}/comm") for t in tasks)),
            "fd_kinds": dict(Counter(_kind(fd) for fd in os.listdir("/proc/self/fd"))), "shm_files": shm,
            **live_objects()}


WATCHED = ("GradsyncGroup", "ProcessGroupGloo", "ProcessGroup", "SharedGroup", "ShmTransport", "DistributedTransport",
           "Work", "EngineWork", "Future", "mmap", "PeerError", "RankFailure")


def live_objects() -> dict:
    """How many objects of the WATCHED types live (a destroyed group's should not), and what
    holds each GradsyncGroup still alive (the referrers' types: where a leak starts)."""
    found = Counter(type(o).__name__ for o in gc.get_objects() if type(o).__name__ in WATCHED)
    groups = [o for o in gc.get_objects() if type(o).__name__ == "GradsyncGroup"]
    holders = Counter(type(r).__name__ for g in groups for r in gc.get_referrers(g) if r is not groups)
    return {"live": dict(found), "group_holders": dict(holders), "groups_alive": len(groups)}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _kind(fd: str) -> str:
    """"socket", "pipe", "anon_inode:[eventfd]", "/dev/shm", "file" or "?" for descriptor ``fd``."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"
    if target.startswith("/dev/shm/"):
        return "/dev/shm"
    return target.split(":")[0] if target.startswith(("socket:", "pipe:")) else \
        target if target.startswith("anon_inode:") else "file"


def is_failing(cycle: int) -> bool:
    return cycle % 10 == 9


def group(store, cycle: int, rank: int, size: int, timeout: float) -> None:
    """A fresh gradsync default group for ``cycle`` (its own key prefix in the store)."""
    import torch.distributed as dist

    dist.init_process_group("gradsync", store=dist.PrefixStore(f"cycle{cycle}/", store), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout))


def one_cycle(store, cycle: int, args) -> dict | None:
    """One group's life on a rank; on a failing cycle, what the rank saw (None on a clean one)."""
    import torch
    import torch.distributed as dist

    failing = is_failing(cycle)
    size = args.workers + failing
    meet(store, cycle, args.rank, args.workers)
    if failing:
        store.wait([f"helper{cycle}/ready"], datetime.timedelta(seconds=300))
    t = torch.full((ELEMENTS,), float(args.rank + 1))
    seen, made = None, False
    try:
        group(store, cycle, args.rank, size, args.timeout)
        made = True
        dist.all_reduce(t)
        want = size * (size + 1) / 2
        if not bool((t == want).all()):
            seen = {"cycle": cycle, "outcome": "wrong result", "got": t[:4].tolist(), "want": want}
        elif failing:
            seen = {"cycle": cycle, "outcome": "ok despite the death"}
    except Exception as exc:          # the helper's death, as the rank met it
        text = str(exc).strip()
        if not made:       # torch counts the failed group: every rank must count alike to meet again
            dist.distributed_c10d._world.group_count = 0
        seen = {"cycle": cycle, "outcome": "error" if made else "error creating the group", "t": time.time(),
                "type": type(exc).__name__,
                "first_line": text.splitlines()[0][:300] if text else "", "peer": getattr(exc, "peer", None)}
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:
        seen = {**(seen or {"cycle": cycle}), "destroy_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return seen


def meet(store, cycle: int, rank: int, workers: int) -> None:
    """Every rank of the job at the start of ``cycle``, at the launcher's store (not a group): a
    rank held up by a failed cycle is waited for, so that the ranks stay in step (without it a
    rank one cycle behind meets nobody again: each cycle's group times out waiting for it)."""
    store.set(f"cycle{cycle}/here/{rank}", "1")
    store.wait([f"cycle{cycle}/here/{r}" for r in range(workers)], datetime.timedelta(seconds=300))


def rank_main(args) -> None:
    """A rank of the job: the cycles, sampled every ``--every``; its record into ``--dir``."""
    import torch.distributed as dist

    import gradsync  # noqa: F401     (registers the backend)

    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=datetime.timedelta(seconds=300))
    samples, seen, started, slowest = [], [], time.time(), (0.0, None)
    for cycle in range(args.cycles):
        began = time.time()
        outcome = one_cycle(store, cycle, args)
        slowest = max(slowest, (round(time.time() - began, 2), cycle))
        if outcome:
            seen.append(outcome)
        if cycle < 2 or (cycle + 1) % args.every == 0:
            samples.append(sample(cycle + 1))
            Path(args.dir, f"rank{args.rank}.json").write_text(json.dumps(
                {"rank": args.rank, "samples": samples, "failures_seen": seen, "slowest_cycle": slowest,
                 "wall_s": round(time.time() - started, 1)}))


def helper_main(args) -> None:
    """The extra rank of failing cycle ``--cycle``: joins, then SIGKILLs itself at a random
    moment around its all_reduce (first noting the instant in the store)."""
    import torch
    import torch.distributed as dist

    import gradsync  # noqa: F401

    rng = random.Random(args.cycle)
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=datetime.timedelta(seconds=300))
    store.set(f"helper{args.cycle}/ready", "1")
    # the ranks are still in earlier cycles: join when they reach this one, not before (the
    # group's rendezvous would time out waiting for them)
    store.wait([f"cycle{args.cycle}/here/{r}" for r in range(args.workers)], datetime.timedelta(seconds=600))
    group(store, args.cycle, args.workers, args.workers + 1, args.timeout)
    delay = rng.choice([0.0, rng.uniform(0, 0.03)])

    def die():
        store.set(f"helper{args.cycle}/died", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    if delay == 0.0:
        die()
    threading.Timer(delay, die).start()
    dist.all_reduce(torch.full((ELEMENTS,), float(args.workers + 1)))
    time.sleep(60)                     # the timer kills it (an all_reduce that ended first: still dies)


def worker_command(args, port: int, role: str, rank: int = 0, cycle: int = 0) -> list[str]:
    return [sys.executable, __file__, "--role", role, "--rank", str(rank), "--cycle", str(cycle), "--port", str(port),
            "--workers", str(args.workers), "--cycles", str(args.cycles), "--every", str(args.every),
            "--timeout", str(args.timeout), "--dir", args.dir]


def helpers(args, port: int, ranks: list) -> list[dict]:
    """Start each failing cycle's helper in turn (the next once the last is gone); their exits."""
    out = []
    for cycle in (c for c in range(args.cycles) if is_failing(c)):
        proc = subprocess.Popen(worker_command(args, port, "helper", cycle=cycle), stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=args.timeout + 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out.append({"cycle": cycle, "rc": proc.returncode, "stderr": err.strip().splitlines()[-3:]})
        if any(r.poll() not in (None, 0) for r in ranks):       # a rank failed: no one will join
            break
    return out


def launch(args) -> dict:
    """Host the store, start the ranks and the helpers, wait; every rank's record."""
    import torch.distributed as dist

    from gradsync.tools.launch import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=300))
    args.dir = args.dir or tempfile.mkdtemp(prefix="gradsync-churn-")
    started = time.time()
    ranks = [subprocess.Popen(worker_command(args, port, "rank", rank=r), stderr=subprocess.PIPE, text=True)
             for r in range(args.workers)]
    helper_exits = helpers(args, port, ranks)
    errors = [p.communicate()[1].strip().splitlines()[-8:] for p in ranks]
    records = []
    for r in range(args.workers):
        path = Path(args.dir, f"rank{r}.json")
        records.append(json.loads(path.read_text()) if path.exists() else {"rank": r, "missing": True})
    died = {h["cycle"]: float(store.get(f"helper{h['cycle']}/died").decode()) for h in helper_exits
            if store.check([f"helper{h['cycle']}/died"])}
    return {"workers": args.workers, "cycles": args.cycles, "timeout_s": args.timeout,
            "wall_s": round(time.time() - started, 1), "rank_exit_codes": [p.returncode for p in ranks],
            "rank_stderr": errors, "helpers": helper_exits, "died_at": died, "ranks": records}


def flatness(result: dict, every: int, timeout: float) -> dict:
    """Per rank and metric: the first sample after warm-up, the last, the growth; and the
    failing cycles' outcomes (named the helper within timeout + 2 s, or what instead)."""
    per_rank, outcomes, took = [], [], []
    for rec in result["ranks"]:
        if rec.get("missing"):
            per_rank.append({"rank": rec["rank"], "missing": True})
            continue
        base = next((s for s in rec["samples"] if s["cycle"] >= every), rec["samples"][0])
        last = rec["samples"][-1]
        per_rank.append({"rank": rec["rank"], "from_cycle": base["cycle"], "to_cycle": last["cycle"],
                         **{m: [base[m], last[m], last[m] - base[m]] for m in METRICS}})
        for seen in rec["failures_seen"]:
            t0 = result["died_at"].get(seen["cycle"])
            s = round(seen["t"] - t0, 3) if t0 and "t" in seen else None
            named = seen.get("peer") == result["workers"] and s is not None and s <= timeout + 2
            took += [s] if s is not None else []
            outcomes.append(("named" if named else seen.get("outcome", "?") + f" (peer {seen.get('peer')})")
                            + (" , destroy failed" if "destroy_error" in seen else ""))
    return {"per_rank": per_rank, "failing_cycle_outcomes": dict(Counter(outcomes)),
            "detection_max_s": max(took) if took else None}


def table(flat: dict) -> str:
    """The flatness as markdown: per rank, each metric's first -> last (growth)."""
    lines = ["| rank | cycles | " + " | ".join(METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
    for r in flat["per_rank"]:
        if r.get("missing"):
            lines.append(f"| {r['rank']} | no record |" + " |" * len(METRICS))
            continue
        cells = [f"{r[m][0]} -> {r[m][1]} ({r[m][2]:+d})" for m in METRICS]
        lines.append(f"| {r['rank']} | {r['from_cycle']}-{r['to_cycle']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nfailing cycles (all ranks): {flat['failing_cycle_outcomes']}, "
                               f"slowest detection {flat['detection_max_s']} s")


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4, choices=[2, 4])
    p.add_argument("--cycles", type=int, default=1000)
    p.add_argument("--every", type=int, default=100, help="sample every N cycles")
    p.add_argument("--timeout", type=float, default=5.0, help="each group's timeout, s")
    p.add_argument("--out", default=None)
    p.add_argument("--role", default="launcher", choices=["launcher", "rank", "helper"], help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cycle", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cycles < 1 or args.every < 1:
        p.error(f"--cycles and --every must be at least 1 (got {args.cycles} and {args.every})")
    return args


def main(argv=None) -> None:
    args = options(argv)
    if args.role != "launcher":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        (rank_main if args.role == "rank" else helper_main)(args)
        return
    result = launch(args)
    result["flatness"] = flatness(result, args.every, args.timeout)
    print(table(result["flatness"]))
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/group_churn.py " +
                                              " ".join(sys.argv[1:] if argv is None else argv), **result}, indent=1))


if __name__ == "__main__":
    main()
