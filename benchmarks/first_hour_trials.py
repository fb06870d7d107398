"""Kill, Ctrl-C and SIGUSR1 trials at random moments of a ``gradsync bench`` run's whole life.

Each trial starts ``gradsync bench`` in its own process group (as a terminal starts a job),
waits a random time after the first worker appears (for 15% of the Ctrl-C trials, a moment
of the 1.5 s before it, while the command itself is importing) (start-up, rendezvous, every row,
``native`` rows included, shutdown), then does one thing:

- ``kill``: SIGKILL one worker. The job must end within ``--timeout`` + 5 s of the kill, exit
  code 2, with one ``gradsync:`` line on stderr naming the killed rank.
- ``ctrl-c``: SIGINT to the whole process group, as Ctrl-C does. The job must end within 10 s,
  with at most 3 lines on stderr, no process left, nothing left in /dev/shm.
- ``usr1``: SIGUSR1 to every worker. No rank may die of it: the run must end with exit code 0.

With ``--memory``, also a few bench runs that fit, each with the memory estimated before the
start beside the measured peak.

Usage: ``python benchmarks/first_hour_trials.py --kills 50 --interrupts 20 --signals 10 --memory
--out docs/results/first_hour_trials.json`` (about 15 s a trial on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections import Counter
import re
import shutil
import signal
import subprocess
import sys
import time

BENCH = ["-m", "gradsync", "bench", "-n", "3", "--sizes", "64KB,4MB", "--algorithms", "ring,tree",
         "--iters", "10"]
SHM = "/dev/shm"
LIFE_S = 14.0          # about how long the run lives after its first worker appears (2 shared cores, loaded)


def default_sigint():
    """In the child before it runs: SIGINT back to its default, as a terminal's job has it (a shell
    running us in the background, or nohup, leaves it ignored, and Python would then ignore Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def children(pid: int) -> list[int]:
    """The worker processes of the bench process ``pid`` (its spawned children), by rank order."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True, text=True).stdout
    return sorted(int(x) for x in out.split())


def shm_names() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith("gradsync")}


def life(timeout: float) -> float:
    """Seconds from the first worker's appearance to the end of one undisturbed run: the span
    the trials' moments are drawn from (it moves with the machine's load)."""
    proc = subprocess.Popen([sys.executable, *BENCH, "--timeout", str(timeout)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=default_sigint)
    while not children(proc.pid) and proc.poll() is None:
        time.sleep(0.02)
    t0 = time.monotonic()
    proc.wait()
    return time.monotonic() - t0


def phase_of(stderr: str) -> str | None:
    """What the killed rank was doing, as the launcher's line says it."""
    m = re.search(r"failed: rank [0-9]+: died \([^)]*\) while ([^;(]*)", stderr) or \
        re.search(r"failed first, [0-9.]+ s after the start: died \([^)]*\) while ([^;]*)", stderr)   # before
    if not m:
        return None
    what = m.group(1)
    for key, name in (("starting", "start-up"), ("meeting", "rendezvous"), ("native", "native row"),
                      ("barrier", "barrier"), ("gathering", "gathering results"), ("flight", "shutdown"),
                      ("shutting", "shutdown"), ("timing", "gradsync row")):
        if key in what:
            return name
    return what


def one(kind: str, rng: random.Random, timeout: float, flight_dir: str, span: float = LIFE_S) -> dict:
    """One trial; its outcome and whether it met the rules."""
    env = {**os.environ, "GRADSYNC_FLIGHT_DIR": flight_dir} if kind == "usr1" else dict(os.environ)
    before = shm_names()
    proc = subprocess.Popen([sys.executable, *BENCH, "--timeout", str(timeout)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                            preexec_fn=default_sigint)
    t0 = time.monotonic()
    early = kind == "ctrl-c" and rng.random() < 0.15       # while the command itself is still importing
    while not early and not children(proc.pid) and proc.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.02)
    delay = rng.uniform(0, 1.5) - 1.5 if early else rng.uniform(0, span)
    time.sleep(abs(delay))
    workers, victim, acted = children(proc.pid), None, time.monotonic()
    done = proc.poll() is not None or not (workers or early)
    if not done:
        if kind == "kill":
            victim = rng.randrange(len(workers))
            os.kill(workers[victim], signal.SIGKILL)
        elif kind == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            for w in workers:
                os.kill(w, signal.SIGUSR1)
    try:
        out, err = proc.communicate(timeout=timeout + 60)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        hung = True
    ended = time.monotonic() - acted
    for folder in re.findall(r"the engine's own messages are in (\S+)", err):
        shutil.rmtree(folder, ignore_errors=True)          # kept for a user to read; not needed here
    lines = [x for x in err.splitlines() if x.strip()]
    left = sorted(shm_names() - before)
    result = {"kind": kind, "delay_s": round(delay, 2), "acted": not done, "rc": proc.returncode,
              "ended_s": round(ended, 2), "stderr_lines": len(lines), "stderr": err[-600:], "hung": hung,
              "shm_left": left, "victim": victim, "phase": phase_of(err) if kind == "kill" else None}
    result["ok"] = judge(result, timeout, lines)
    return result


def judge(r: dict, timeout: float, lines: list[str]) -> bool:
    """The rules of the trial's kind (see the module's docstring)."""
    if r["hung"] or r["shm_left"]:
        return False
    if r["kind"] == "kill":
        if not r["acted"]:                 # the run ended before the kill: nothing to judge but its exit
            return r["rc"] == 0
        if r["rc"] == 0:                   # the victim had already reported and was exiting
            return True
        return (r["rc"] == 2 and r["ended_s"] <= timeout + 5 and len(lines) == 1
                and lines[0].startswith("gradsync:") and f"rank {r['victim']}: died" in lines[0])
    if r["kind"] == "ctrl-c":
        return r["ended_s"] <= 10 and r["stderr_lines"] <= 3 and r["rc"] in (0, 130)
    return r["rc"] == 0


# bench runs that fit, to set the estimate made before the start against the measured peak
MEMORY_RUNS = [["-n", "2", "--sizes", "64MB", "--algorithms", "ring"],
               ["-n", "2", "--sizes", "16MB,64MB"],
               ["-n", "4", "--sizes", "32MB", "--algorithms", "ring,tree,central,host"],
               ["-n", "3", "--sizes", "4KB,1MB,16MB"]]


def memory_checks() -> list[dict]:
    """Each MEMORY_RUNS run: the estimate beside the measured peak (the largest worker's resident
    high-water mark) and the estimated time beside the wall time."""
    from gradsync.cli.benchmark import _bench_chosen
    from gradsync.cli.common import _sizes
    from gradsync.tools.bench import estimate

    out = []
    for extra in MEMORY_RUNS:
        t0 = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "gradsync", "bench", *extra, "--format", "json"],
                             capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
        rows = json.loads(run.stdout)
        args = dict(zip(extra[::2], extra[1::2]))
        workers, names = int(args["-n"]), _bench_chosen(args.get("--algorithms"), "float32")
        beside = int("--algorithms" not in args)
        est = estimate(_sizes(args["--sizes"], None, None, "float32"), workers, names, "float32", beside)
        peak = max(r["peak_rss_bytes"] for r in rows)
        out.append({"bench": " ".join(extra), "estimated_worker_bytes": est["per_worker_bytes"],
                    "measured_peak_bytes": peak, "ratio": round(est["per_worker_bytes"] / peak, 3),
                    "estimated_s": round(est["seconds"], 1), "wall_s": round(wall, 1)})
        print(out[-1], flush=True)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--interrupts", type=int, default=20)
    parser.add_argument("--signals", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iters", type=int, default=10, help="bench's --iters: more spends more of the life in rows.")
    parser.add_argument("--span", type=float, default=None,
                        help="Seconds to draw the moments from (default: measured on one undisturbed run).")
    parser.add_argument("--out", default=None)
    parser.add_argument("--memory", action="store_true", help="Also set the memory estimate against measured peaks.")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    BENCH[BENCH.index("--iters") + 1] = str(args.iters)
    kinds = ["kill"] * args.kills + ["ctrl-c"] * args.interrupts + ["usr1"] * args.signals
    rng.shuffle(kinds)
    results = []
    flight_dir = f"/tmp/gradsync-trials-flight-{os.getpid()}"
    span = life(args.timeout) if args.span is None else args.span
    print(f"moments drawn from 0-{span:.1f} s after the first worker appears", flush=True)
    for k, kind in enumerate(kinds):
        r = one(kind, rng, args.timeout, flight_dir, span)
        results.append(r)
        print(f"{k + 1}/{len(kinds)} {kind} at {r['delay_s']} s: rc {r['rc']}, ended {r['ended_s']} s after, "
              f"{r['stderr_lines']} stderr lines, {'ok' if r['ok'] else 'FAILED: ' + r['stderr'][-300:]}",
              flush=True)
    summary = {kind: {"trials": sum(r["kind"] == kind for r in results),
                      "acted": sum(r["kind"] == kind and r["acted"] for r in results),
                      "ok": sum(r["kind"] == kind and r["ok"] for r in results),
                      "hangs": sum(r["kind"] == kind and r["hung"] for r in results),
                      "slowest_end_s": max((r["ended_s"] for r in results if r["kind"] == kind), default=None),
                      "most_stderr_lines": max((r["stderr_lines"] for r in results if r["kind"] == kind),
                                               default=None),
                      "phases": dict(Counter(r["phase"] for r in results if r["kind"] == kind and r["phase"]))}
               for kind in ("kill", "ctrl-c", "usr1")}
    print(json.dumps(summary, indent=1))
    memory = memory_checks() if args.memory else None
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"command": "python benchmarks/first_hour_trials.py " + " ".join(argv or sys.argv[1:]),
                       "bench": " ".join(BENCH[1:]), "timeout_s": args.timeout, "span_s": span, "summary": summary,
                       "memory": memory, "trials": results}, fh, indent=1)


if __name__ == "__main__":
    main()
