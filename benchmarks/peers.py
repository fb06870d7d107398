"""gradsync against its peers on one host: Gloo, Open MPI and DeepSpeed's shared-memory
all-reduce, taking turns call by call in the same launches, every result checked.

Usage: python benchmarks/peers.py [--workers 2,4] [--sizes 4KiB,64KiB,1MiB,16MiB,64MiB]
           [--launches 3] [--calls 0] [--warmup 3] [--systems gloo,mpi,deepspeed,gradsync,backend]
           [--timeout 900] [--out docs/results/peers.json]

Each launch is one ``mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl
self,vader -np N`` of ``benchmarks/peers_rank.py`` (see it for what each rank does): N local
processes, one thread each where the cores allow no more (``OMP_NUM_THREADS``, the cores
divided among the ranks, for every system alike), in which five all-reduces of the whole
float32 tensor (SUM) take turns call by call at each size:

  Gloo                 ``torch.distributed.all_reduce`` on a Gloo group
  Open MPI             mpi4py's ``comm.Allreduce(MPI.IN_PLACE, view)``
  DeepSpeed shm        DeepSpeed's CPU shared-memory all-reduce (``deepspeed`` package, its op
                       built here with gcc, no oneCCL; skipped, with a note, when unavailable)
  gradsync.all_reduce  ``gradsync.all_reduce(t, algorithm="auto")``
  gradsync backend     ``torch.distributed.all_reduce`` on a ``new_group(backend="gradsync")``

Every call starts after a barrier (so that all ranks arrive together) and is checked exactly
against a float64 sum of the inputs; a wrong result ends the run (exit 1) naming the system,
size, rank and element. A figure is the median over calls of the slowest rank's time per
call, then the median over launches. Printed per N: a table of microseconds per system and
size, and each gradsync column's time over the best peer's (below 1: gradsync is faster).
A launch that does not finish within ``--timeout`` seconds is ended, each rank printing where
it was stuck. Bad options: one line, exit 2.
"""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradsync.units import parse_size

SYSTEMS = ("gloo", "mpi", "deepspeed", "gradsync", "backend")
PEERS = ("gloo", "mpi", "deepspeed")
LABELS = {"gloo": "Gloo", "mpi": "Open MPI", "deepspeed": "DeepSpeed shm",
          "gradsync": "gradsync.all_reduce", "backend": "gradsync backend"}

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "peers_rank.py"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader"]


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"peers.py: error: {message}\n")
        sys.exit(2)


def bad(message: str):
    """A bad option or a missing tool: one line, exit 2."""
    sys.stderr.write(f"peers.py: error: {message}\n")
    sys.exit(2)


def parse_list(text: str, what: str, convert) -> list:
    try:
        return [convert(x.strip()) for x in text.split(",") if x.strip()] or bad(f"--{what}: empty list")
    except (ValueError, ArithmeticError) as e:
        bad(f"--{what} {text!r}: {e}")


def positive_workers(x: str) -> int:
    if not x.isdigit():
        raise ValueError(f"{x!r} is not a whole number of processes")
    if int(x) < 2:
        raise ValueError(f"{x} process: an all-reduce between processes needs at least 2")
    n = int(x)
    return n


def float32_size(x: str) -> int:
    size = parse_size(x)       # a ConfigError (a ValueError) names the text and the units it takes
    if size <= 0 or size % 4:
        raise ValueError(f"{x} = {size} bytes: expected a positive whole number of float32 elements (4 bytes)")
    return size


def known_system(x: str) -> str:
    if x not in SYSTEMS:
        raise ValueError(f"unknown system {x!r}: expected some of {', '.join(SYSTEMS)}")
    return x


def parse(argv=None):
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4", help="local processes per launch, e.g. 2,4")
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB", help="bytes of float32 per all-reduce")
    ap.add_argument("--launches", type=int, default=3, help="launches per N (figures: medians over them)")
    ap.add_argument("--calls", type=int, default=0, help="timed calls per system and size (0: 200, fewer above 4 MiB)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed (checked) calls per system and size first")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="some of " + ",".join(SYSTEMS))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a launch (and DeepSpeed's build) may take")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    args.workers = parse_list(args.workers, "workers", positive_workers)
    args.sizes = parse_list(args.sizes, "sizes", float32_size)
    args.systems = list(dict.fromkeys(parse_list(args.systems, "systems", known_system)))
    for name, least in (("launches", 1), ("calls", 0), ("warmup", 0)):
        if getattr(args, name) < least:
            bad(f"--{name} {getattr(args, name)}: expected at least {least}")
    if not args.timeout > 0:
        bad(f"--timeout {args.timeout}: expected seconds > 0")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        bad(f"--out {args.out}: folder {Path(args.out).resolve().parent} does not exist")
    return args


def check_tools():
    """Open MPI runs every launch, so mpirun and mpi4py are required (one line, exit 2 if not)."""
    if shutil.which("mpirun") is None:
        bad("mpirun not found on PATH: every launch runs under Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    if importlib.util.find_spec("mpi4py") is None:
        bad("mpi4py is not installed: pip install -e '.[bench]'")


def deepspeed_op(timeout: float) -> tuple[str, str]:
    """(library path or "", one line on what happened): DeepSpeed's op built, or why not."""
    if importlib.util.find_spec("deepspeed") is None:
        return "", "skipped: the deepspeed package is not installed (pip install -e '.[bench]')"
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, str(RANK_SCRIPT), "--build-deepspeed"], capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "", f"skipped: its op did not build within {timeout:g} s"
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not Path(path).is_file():
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return "", f"skipped: its op did not build ({why})"
    return path, f"built or found in {time.perf_counter() - start:.0f} s: {path}"


def threads_per_rank(n: int) -> int:
    """OMP_NUM_THREADS if set, else this machine's cores divided among the N ranks (at least 1)."""
    return int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // n))


def launch(n: int, args, ds_path: str) -> dict:
    """One launch of N ranks; its results (rank 0's JSON), or exit 1 with why."""
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        out = Path(tmp) / "launch.json"
        cmd = MPIRUN + ["-np", str(n), sys.executable, str(RANK_SCRIPT), "--sizes", ",".join(map(str, args.sizes)),
                        "--systems", ",".join(args.systems), "--deepspeed", ds_path, "--calls", str(args.calls),
                        "--warmup", str(args.warmup), "--timeout", str(args.timeout), "--out", str(out)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_rank(n)))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            report(stdout, stderr)
            sys.exit(f"peers: a launch at N = {n} did not finish within {args.timeout + 60:g} s and was killed")
        if proc.returncode != 0 or not out.is_file():
            report(stdout, stderr)
            if "Timeout (" in stderr:     # a rank's watchdog (faulthandler) printed its stack and ended it
                sys.exit(f"peers: a launch at N = {n} timed out: a rank waited over {args.timeout:g} s "
                         "(the stacks above show in which call)")
            sys.exit(f"peers: a launch at N = {n} failed (mpirun exit {proc.returncode}); see the lines above")
        return json.loads(out.read_text())


def report(stdout: str, stderr: str, tail: int = 40):
    """What a failed launch printed: its last lines, then its own one-line verdicts again."""
    lines = (stdout + "\n" + stderr).strip().splitlines()
    print("\n".join(lines[-tail:]), file=sys.stderr)
    for line in lines:
        if line.startswith("peers: "):
            print(line, file=sys.stderr)


def summarize(launches: list[dict], systems: list[str]) -> list[dict]:
    """Per size: each system's median over launches (and per launch), in us; gradsync's over the best peer's."""
    rows = []
    for i, size in enumerate(launches[0]["sizes"]):
        per_launch = {s: [round(run["sizes"][i]["median_s"][s] * 1e6, 2) for run in launches] for s in systems}
        median = {s: round(statistics.median(v), 2) for s, v in per_launch.items()}
        row = {"bytes": size["bytes"], "calls": size["calls"], "median_us": median, "per_launch_us": per_launch}
        peers = [s for s in PEERS if s in median]
        if peers:
            best = min(peers, key=median.get)
            row["best_peer"] = best
            for ours in ("gradsync", "backend"):
                if ours in median:
                    row[f"{ours}_over_best_peer"] = median[ours] / median[best]
        rows.append(row)
    return rows


def us(x: float) -> str:
    return f"{x:,.1f}" if x < 10 else f"{x:,.0f}"


def size_text(b: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def table(n: int, rows: list[dict], systems: list[str], threads: int) -> str:
    """A Markdown table of one N: median us per system and size, gradsync's over the best peer's."""
    ours = [s for s in ("gradsync", "backend") if s in systems and any(p in systems for p in PEERS)]
    head = ["size"] + [LABELS[s] for s in systems] + [f"{LABELS[s]} / best peer" for s in ours]
    lines = [f"N = {n} ({threads} thread{'s' * (threads > 1)} per rank), median us per call:",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [size_text(row["bytes"])] + [us(row["median_us"][s]) for s in systems]
        cells += [f"{row[f'{s}_over_best_peer']:.2f}x ({LABELS[row['best_peer']]})" for s in ours]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def git_commit() -> str:
    out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def main(argv=None):
    args = parse(argv)
    check_tools()
    result = {"command": " ".join(["python", "benchmarks/peers.py"] + sys.argv[1:]),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cores": os.cpu_count(),
              "load_average_at_start": os.getloadavg(), "git_commit": git_commit(), "workers": {}}
    ds_path = ""
    if "deepspeed" in args.systems:
        ds_path, note = deepspeed_op(args.timeout)
        print(f"DeepSpeed shm: {note}", flush=True)
        result["deepspeed"] = note
        if not ds_path:
            args.systems.remove("deepspeed")
            if not args.systems:
                bad("--systems deepspeed: nothing left to run without DeepSpeed")
    for n in args.workers:
        launches = [launch(n, args, ds_path) for _ in range(args.launches)]
        rows = summarize(launches, args.systems)
        print(table(n, rows, args.systems, launches[0]["threads_per_rank"]) + "\n", flush=True)
        result["versions"] = launches[0]["versions"]
        result["workers"][str(n)] = {"threads_per_rank": launches[0]["threads_per_rank"], "launches": len(launches),
                                     "sizes": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
