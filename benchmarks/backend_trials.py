"""Kill or stop a random rank at a random moment of DDP, FSDP2 and HSDP training on the gradsync
backend under torchrun; record what every survivor does, and what the trial leaves behind.

Each trial runs ``benchmarks/trial_job.py`` under ``torchrun --nproc-per-node 4`` (CPU, a float64
MLP of 5.5k parameters, 12 steps, a torch.distributed.checkpoint save half-way), as DDP, as
FSDP2 (``fully_shard`` on the world) or as HSDP (``fully_shard`` on
``init_device_mesh("cpu", (2, 2))``). One random rank SIGKILLs or SIGSTOPs itself at a random
moment of a random phase: start-up (imports, ``init_process_group``), init, the first
collective, a training step, the checkpoint, the final gather, shutdown (``destroy_process_group``,
the interpreter's exit). Every tenth trial is a control without a fault. Commands::

    python benchmarks/backend_trials.py --trials 100 --timeout 10 --out docs/results/backend_trials.json
    python benchmarks/backend_trials.py --trials 30 --backend gloo --out docs/results/backend_trials_gloo.json
    python benchmarks/backend_trials.py --trials 2 --kinds ddp --faults kill     # a quick look
    python benchmarks/backend_trials.py --elastic --trials 10 --out docs/results/backend_elastic.json

For every survivor it records the first line of the error it raised (with the exception's
``peer``), its exit (code or signal, read from its zombie before torchrun reaps it), the
seconds from the fault to its error and to its exit, and whether it named the victim; after the
trial, gradsync's segments left in /dev/shm by the trial's processes, and the trial's processes
still alive once torchrun has ended. A trial whose survivors are not all over within
``--timeout`` + ``--hang-margin`` s of the fault is a hang: their stacks are dumped into their
stderr files (SIGUSR2, faulthandler) and they are killed. A stopped victim is sent SIGCONT once
the survivors are over (what it then does is recorded), and SIGKILL 3 s later if it lives.

torchrun's agent is started with ``--monitor-interval 3600``: with its default (0.1 s) it
SIGTERMs every survivor within 0.1 s of a death, before any could report it, and the trial would
measure the agent. The harness ends the agent itself (SIGTERM) once the workers are over.

``--elastic``: ``torchrun --max-restarts 1`` (default monitor interval), a checkpoint every 2
steps, one SIGKILL at a random step of the first attempt; the agent restarts every worker, they
resume from the last checkpoint, and the final weights are compared with an uninterrupted run
of the same job on Gloo (same seed, same data order) and with the one-process reference.
The columns of the tables are described in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import trial_report  # noqa: E402
from trial_watch import Watch, kill, segments, sessions  # noqa: E402

JOB = Path(__file__).resolve().parent / "trial_job.py"
WORKERS = 4
PHASES = ("start-up", "init", "first-collective", "training", "checkpoint", "final-gather", "shutdown")
# how far past entering each phase a fault may land (s): about the phase's length on 2 loaded cores
SPAN = {"start-up": 6.0, "init": 3.0, "first-collective": 0.2, "training": 0.015, "checkpoint": 0.15,
        "final-gather": 0.05, "shutdown": 0.3}


def draw(rng: random.Random, args) -> list[dict]:
    """The trials' plans: kinds in turn, every ``--control-every``-th without a fault."""
    kinds, faults, phases = args.kinds.split(","), args.faults.split(","), args.phases.split(",")
    plans = []
    for i in range(args.trials):
        plan = {"trial": i, "kind": kinds[i % len(kinds)], "fault": None}
        if args.elastic or (i + 1) % args.control_every:
            phase = "training" if args.elastic else rng.choice(phases)
            plan["fault"] = {"rank": rng.randrange(WORKERS), "signal": "kill" if args.elastic else rng.choice(faults),
                             "phase": phase, "step": rng.randrange(1, args.steps),
                             "delay": 0.0 if rng.random() < 0.3 else round(rng.uniform(0, SPAN[phase]), 4)}
        plans.append(plan)
    return plans


def command(plan: dict, args, folder: str, backend: str, elastic: bool) -> list[str]:
    from gradsync.tools.launch import free_port

    agent = ["--max-restarts", "1"] if elastic else ["--monitor-interval", "3600"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS), "--master-port",
            str(free_port()), *agent, str(JOB), "--kind", plan["kind"], "--backend", backend,
            "--timeout", str(args.timeout), "--steps", str(args.steps), "--seed", str(args.seed), "--dir", folder,
            *(["--checkpoint-every", "2"] if elastic else [])]


def run(plan: dict, args, backend: str | None = None, elastic: bool | None = None) -> dict:
    """One trial: launch, watch, end the agent, look for what is left; the raw facts."""
    backend = backend or args.backend
    elastic = args.elastic if elastic is None else elastic
    folder = tempfile.mkdtemp(prefix="gradsync-trial-")
    env = {**os.environ, "GRADSYNC_TRIAL_FAULT": json.dumps(plan["fault"])}
    started, stalled = time.time(), stall_s()
    with open(os.path.join(folder, "torchrun.out"), "w") as out:
        proc = subprocess.Popen(command(plan, args, folder, backend, elastic), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    watch = Watch(proc.pid, JOB.name)
    hung, victim_after = watch_until_over(proc, watch, plan, args, folder, elastic)
    agent_rc = end_agent(proc, watch, elastic)
    left = leftovers(watch)
    facts = {**plan, "backend": backend, "elastic": elastic, "folder": folder, "wall_s": round(time.time() - started, 2),
             "agent_rc": agent_rc, "hung_ranks": hung,
             "machine_stall_s": round(stall_s() - stalled, 2), "victim_after_cont": victim_after, **left,
             "workers": sorted(watch.workers.values(), key=lambda w: (w["attempt"], w["rank"])),
             "note": read_json(os.path.join(folder, "fault.json")),
             "torchrun_tail": tail(os.path.join(folder, "torchrun.out"), 12)}
    facts["records"] = {name[:-5]: read_json(os.path.join(folder, name))
                        for name in sorted(os.listdir(folder)) if name.startswith("a") and name.endswith(".json")}
    facts["stderr"] = {name[:-4]: tail(os.path.join(folder, name), 80)
                       for name in sorted(os.listdir(folder)) if name.endswith(".err")}
    return facts


def watch_until_over(proc, watch, plan: dict, args, folder: str, elastic: bool):
    """Poll until the survivors are over (elastic: until torchrun is) or the hang deadline, when
    the ranks still running are dumped and killed. A stopped victim gets SIGCONT once the others
    are over. Returns (the hung ranks, what became of a stopped victim)."""
    started, victim_after = time.time(), None
    while True:
        watch.poll()
        note = read_json(os.path.join(folder, "fault.json"))
        limit = args.budget if elastic else args.timeout + args.hang_margin
        deadline = note["t"] + limit if note else started + args.budget
        over = proc.poll() is not None or (not elastic and watch.survivors_over(plan["fault"], WORKERS))
        stopped = watch.stopped_victim(plan["fault"])
        if over and stopped:
            victim_after = resume_victim(watch, stopped)
        elif over:
            return [], victim_after
        elif time.time() > deadline:
            return dump_and_kill(watch, plan["fault"]), victim_after
        time.sleep(0.05)


def resume_victim(watch, pid: int) -> dict:
    """SIGCONT a stopped victim; SIGKILL it if it still lives 3 s later. What became of it."""
    kill(pid, signal.SIGCONT)
    until = time.time() + 3.0
    while time.time() < until and watch.workers[pid]["ended"] is None:
        time.sleep(0.05)
        watch.poll()
    killed = watch.workers[pid]["ended"] is None and kill(pid, signal.SIGKILL)
    watch.workers[pid]["resumed"] = True
    return {"pid": pid, "killed_after_3s": bool(killed)}


def dump_and_kill(watch, fault) -> list[int]:
    """The ranks still running past the deadline: their stacks into their stderr files, then SIGKILL."""
    alive = [w for w in watch.workers.values() if w["ended"] is None]
    for w in alive:
        kill(w["pid"], signal.SIGUSR2)
    time.sleep(1.0)
    for w in alive:
        kill(w["pid"], signal.SIGKILL)
        w["hung"] = True
    time.sleep(0.2)
    watch.poll()
    return sorted(w["rank"] for w in alive if not fault or w["rank"] != fault["rank"] or w["attempt"])


def end_agent(proc, watch, elastic: bool):
    """torchrun's exit code: it ends by itself under --elastic, else the harness sends SIGTERM."""
    if proc.poll() is None and not elastic:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        watch.poll()


def leftovers(watch) -> dict:
    """Processes of the trial's sessions alive 1 s after torchrun ended (then killed), and the
    segments in /dev/shm made by any of the trial's processes."""
    time.sleep(1.0)
    alive = {pid: p for pid, p in sessions(watch.sids).items() if p.state not in "ZX"}
    for pid in alive:
        kill(pid, signal.SIGKILL)
    left = sorted(segments(watch.seen))
    return {"processes_left": [{"pid": pid, "state": p.state, "worker": pid in watch.workers} for pid, p in alive.items()],
            "segments_left": left}


def stall_s() -> float:
    """Seconds this machine has spent with every task stalled on memory since boot (PSI), or 0:
    a trial during which it grew was measured on a machine that stopped, not on the backend."""
    try:
        with open("/proc/pressure/memory") as f:
            full = next(line for line in f if line.startswith("full"))
        return int(full.split("total=")[1]) / 1e6
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [x.rstrip() for x in f.read().splitlines() if x.strip()][-lines:]
    except OSError:
        return []


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0, help="the group's timeout (init_process_group), s")
    p.add_argument("--kinds", default="ddp,fsdp,hsdp")
    p.add_argument("--faults", default="kill,stop")
    p.add_argument("--phases", default=",".join(PHASES), help="the moments to draw from")
    p.add_argument("--backend", default="gradsync", choices=["gradsync", "gloo"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--control-every", type=int, default=10, help="every N-th trial runs without a fault")
    p.add_argument("--hang-margin", type=float, default=15.0, help="s past timeout after the fault before a hang")
    p.add_argument("--budget", type=float, default=240.0, help="s a trial may take before its fault (or in all)")
    p.add_argument("--elastic", action="store_true", help="torchrun --max-restarts 1, one kill, resume, compare")
    p.add_argument("--keep", action="store_true", help="keep each trial's folder (the ranks' files)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    bad = sorted(set(args.kinds.split(",")) - {"ddp", "fsdp", "hsdp"}) + \
        sorted(set(args.faults.split(",")) - {"kill", "stop"}) + sorted(set(args.phases.split(",")) - set(PHASES))
    if bad or args.trials < 1:
        p.error(f"--kinds takes ddp,fsdp,hsdp, --faults kill,stop, --phases {','.join(PHASES)} "
                f"(got {', '.join(bad) or args.trials} trials)")
    return args


def main(argv=None) -> None:
    args = options(argv)
    plans = draw(random.Random(args.seed), args)
    refs = trial_report.references(args, plans, run)
    results = []
    for plan in plans:
        facts = run(plan, args)
        trial = trial_report.judge(facts, args, refs)
        results.append(trial)
        print(trial_report.line(trial, len(plans)), flush=True)
        if not args.keep:
            shutil.rmtree(facts["folder"], ignore_errors=True)
    summary = trial_report.summarize(results, args)
    print(trial_report.tables(summary, args))
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/backend_trials.py " +
                                              " ".join(sys.argv[1:] if argv is None else argv),
                                              "summary": summary, "trials": results}, indent=1))


if __name__ == "__main__":
    main()
