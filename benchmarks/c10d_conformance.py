"""PyTorch's own collective tests run against Gloo and against the gradsync backend, side by side.

Usage:
    python benchmarks/c10d_conformance.py --pytorch ~/src/pytorch          # a checkout of pytorch/pytorch
    python benchmarks/c10d_conformance.py --tests-dir DIR                  # a folder holding the two files
        [--profiles auto,engine,ring,...|all] [--match REGEX] [--lazy-init] [--every-test]
        [--timeout 90] [--jobs 1] [--spawn] [--out results.json] [--table table.txt]

The tests are PyTorch's, not gradsync's: ``test/distributed/test_c10d_gloo.py`` and the
``test_c10d_common.py`` it imports (its helpers come from ``torch.testing._internal``, which ships
with torch; that package imports ``expecttest``: ``pip install expecttest``). They are not in
this repository. Take the two files of the torch you run, e.g. for torch 2.13::

    git clone --depth 1 --branch v2.13.0 https://github.com/pytorch/pytorch   # then --pytorch pytorch
    # or only the two files, into one folder (then --tests-dir that folder):
    curl -O https://raw.githubusercontent.com/pytorch/pytorch/v2.13.0/test/distributed/test_c10d_gloo.py
    curl -O https://raw.githubusercontent.com/pytorch/pytorch/v2.13.0/test/distributed/test_c10d_common.py

Each test runs first as it is written (Gloo). Then, for each profile, with every assertion
unchanged and only the process group's creation pointed at gradsync: ``init_process_group``
called with "gloo" (by the tests, directly or through their helpers) makes a "gradsync" group
instead, and ``ProcessGroupGlooTest._create_process_group_gloo`` (which builds a bare
``ProcessGroupGloo`` on the test's store) makes one with ``init_process_group("gradsync")`` on
that store, with the timeout of the options the test passes. Groups the tests ask for by name
with ``new_group(backend="gloo")`` stay Gloo (they verify the group under test). The patch is
made in this script's worker and, since ``MultiProcessTestCase`` spawns its ranks and spawn runs
the parent's main script first, in every rank too.

A profile is a GRADSYNC_ALGORITHMS value: "auto" (the default), or one choice forced for every
collective kind that takes it and "engine" for the kinds that do not (so a failure in that
column is the forced choice's, or the backend's common path's); "ring/gloo" is the ring with
its messages over the engine's send and receive instead of shared memory. Unless
--every-test, a profile runs only the tests that passed on Gloo (the others say nothing about
gradsync). ``ProcessGroupGlooLazyInitTest`` (the same bodies with Gloo's lazy connection
option) runs only with --lazy-init.

The table says per test: pass, FAIL (an assertion), ERROR (anything else raised), skip, TIME
(past --timeout) or - (not run); a "!" after it means a rank of that test ended by a signal
(e.g. SIGABRT, SIGSEGV; not SIGTERM, which PyTorch's runner sends the other ranks once one has
failed) whatever rank 0's verdict. Below it, each failure's
first line per profile. ``auto``'s choices are measured by each run (a fresh verdict cache), so
they, and with them auto's column, can differ between machines and runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = ("test_c10d_gloo.py", "test_c10d_common.py")
MODULE = "test_c10d_gloo"
BACKEND_ENV = "C10D_CONFORMANCE_BACKEND"      # "gradsync" in the worker and its ranks: the patch is on
TESTS_ENV = "C10D_CONFORMANCE_TESTS"          # the folder holding PyTorch's two files
LAZY_CLASS = "ProcessGroupGlooLazyInitTest"
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")


# --- the patch: the group's creation pointed at gradsync (worker and ranks) --------------------
def _to_gradsync(backend):
    """The backend string a test passed, with "gloo" read as "gradsync" (None stays None)."""
    if isinstance(backend, str):
        return re.sub(r"(?i)\bgloo\b", "gradsync", backend)
    return backend


def point_at_gradsync(tests_dir: str) -> None:
    """Make the tests' process groups gradsync's: ``init_process_group("gloo")`` and
    ``ProcessGroupGlooTest._create_process_group_gloo``; assertions stay as they are."""
    import datetime

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import gradsync.distributed

    gradsync.distributed.register()
    original = c10d.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        return original(_to_gradsync(backend), *args, **kwargs)

    dist.init_process_group = c10d.init_process_group = init_process_group
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    tests = __import__(MODULE)

    def create_group(self, store, rank, world_size, opts):
        timeout = opts._timeout
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        dist.init_process_group("gradsync", store=store, rank=self.rank, world_size=self.world_size,
                                timeout=timeout)
        pg = c10d._get_default_group()
        dist.barrier(group=pg)
        return pg

    tests.ProcessGroupGlooTest._create_process_group_gloo = create_group


if __name__ == "__mp_main__" and os.environ.get(BACKEND_ENV) == "gradsync":
    point_at_gradsync(os.environ[TESTS_ENV])        # a spawned rank: the same patch as its parent


# --- the worker: runs a list of tests in one process, one JSON line per test -----------------
def _first_line(text: str) -> str:
    """The line that says what went wrong: the innermost exception's line of the first traceback
    (a rank's, for multi-process tests), with the next line when it says little by itself."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    start = starts[1] if len(starts) > 1 and "exited with error code" in text else (starts[0] if starts else 0)
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line and not line.startswith((" ", "Traceback", "During handling", "The above exception")):
            nxt = next((x.strip() for x in lines[i + 1:i + 4] if x.strip()), "")
            if len(line) < 60 and nxt and not nxt.startswith(("Traceback", "Process ", "File ", "To execute")):
                line = f"{line} | {nxt}"
            return line[:220]
    return (lines[-1] if lines else "")[:220]


def _exit_codes() -> dict:
    """Record each multi-process test's rank exit codes, by test id (the check itself unchanged)."""
    from torch.testing._internal.common_distributed import MultiProcessTestCase

    seen = {}
    check = MultiProcessTestCase._check_return_codes

    def recording(self, *args, **kwargs):
        seen[self.id()] = [p.exitcode for p in getattr(self, "processes", [])]
        return check(self, *args, **kwargs)

    MultiProcessTestCase._check_return_codes = recording
    return seen


def _fork_ranks() -> None:
    """Start each multi-process test's ranks by fork instead of spawn: a spawned rank imports
    torch and the tests anew (tens of seconds for 4 ranks on 2 loaded cores); a forked one has
    them already. The ranks run the same test body either way."""
    import torch.multiprocessing
    from torch.testing._internal.common_distributed import MultiProcessTestCase

    def fork_processes(self):
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    MultiProcessTestCase._spawn_processes = fork_processes


def _verdict(result, test_id: str, seconds: float, timeout: float) -> tuple[str, str]:
    for kind, items in (("skip", result.skipped), ("FAIL", result.failures), ("ERROR", result.errors)):
        for _, detail in items:
            if kind == "skip":
                return "skip", str(detail)[:220]
            line = _first_line(detail)
            if "timed out" in detail and seconds >= timeout - 1:
                return "TIME", line
            return ("FAIL" if line.startswith("AssertionError") else kind), line
    return "pass", ""


def worker(tests_dir: str, ids: list[str], results: str, timeout: float, spawn: bool) -> None:
    """Run ``ids`` (unittest ids in test_c10d_gloo) here, appending one JSON line each to ``results``."""
    import unittest

    if os.environ.get(BACKEND_ENV) == "gradsync":
        point_at_gradsync(tests_dir)
    sys.path.insert(0, tests_dir)
    codes = _exit_codes()
    if not spawn:
        _fork_ranks()
    loader = unittest.TestLoader()
    for test_id in ids:
        suite = loader.loadTestsFromName(test_id, __import__(MODULE))
        result = unittest.TestResult()
        started = time.monotonic()
        suite.run(result)
        seconds = time.monotonic() - started
        status, message = _verdict(result, test_id, seconds, timeout)
        with open(results, "a") as f:
            f.write(json.dumps({"test": test_id, "status": status, "message": message, "seconds": round(seconds, 2),
                                "exit_codes": codes.get(_full_id(test_id), [])}) + "\n")


def _full_id(test_id: str) -> str:
    return f"{MODULE}.{test_id}"


# --- the driver: list, run on Gloo, run per profile, print the table --------------------------
def _refuse(message: str) -> None:
    """Bad input: one line on stderr, exit status 2."""
    print(f"c10d_conformance: {message}", file=sys.stderr)
    raise SystemExit(2)


def tests_dir_of(args) -> Path:
    folder = Path(args.tests_dir) if args.tests_dir else Path(args.pytorch) / "test" / "distributed"
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        _refuse(f"{folder} has no {', '.join(missing)}: give --pytorch a checkout of pytorch/pytorch or "
                f"--tests-dir a folder holding {' and '.join(FILES)}")
    return folder


def list_tests(folder: Path) -> list[str]:
    """Every test id of test_c10d_gloo (Class.test_name), in file order, from a fresh process."""
    code = ("import sys, unittest; sys.path.insert(0, sys.argv[1]); import test_c10d_gloo as m\n"
            "def walk(s):\n    for t in s:\n        yield from walk(t) if isinstance(t, unittest.TestSuite) else [t.id()]\n"
            "print('\\n'.join(walk(unittest.TestLoader().loadTestsFromModule(m))))")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=600)
    if out.returncode:
        _refuse(f"importing {MODULE} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return [line.split(".", 1)[1] for line in out.stdout.split()]


def profiles(names: str) -> dict[str, str]:
    """{profile: GRADSYNC_ALGORITHMS value} for "all" or a comma-separated list of names."""
    from gradsync.distributed import config

    choices = ["auto", "engine"] + sorted({c for k in KINDS for c in config.allowed(k)} - {"auto", "engine"})
    table = {"auto": ""}
    for choice in choices[1:]:
        table[choice] = ",".join(f"{k}={choice if choice in config.allowed(k) else 'engine'}" for k in KINDS)
    table["ring/gloo"] = table["ring"] + ",transport=gloo"
    wanted = list(table) if names == "all" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in table]
    if unknown:
        _refuse(f"unknown profile {', '.join(unknown)}: expected all or some of {', '.join(table)}")
    return {n: table[n] for n in wanted}


def run_profile(folder: Path, ids: list[str], backend: str, algorithms: str, args) -> dict:
    """Run ``ids`` on ``backend`` with GRADSYNC_ALGORITHMS=``algorithms`` in --jobs workers: {test: row}.
    A worker that dies has its test marked ERROR and the rest of its share run by a new one."""
    scratch = Path(tempfile.mkdtemp(prefix="c10d_conformance_"))
    env = {**os.environ, BACKEND_ENV: backend, TESTS_ENV: str(folder), "GRADSYNC_ALGORITHMS": algorithms,
           "GRADSYNC_AUTO_CACHE": str(scratch / "auto.json"),
           "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(int(args.timeout)), "PYTHONUNBUFFERED": "1"}
    left = [ids[i::args.jobs] for i in range(args.jobs)]
    rows, attempt = {}, 0
    while any(left):
        procs = []
        for share in filter(None, left):
            attempt += 1
            results = scratch / f"results{attempt}.jsonl"
            cmd = [sys.executable, os.path.abspath(__file__), "--timeout", str(args.timeout),
                   *(["--spawn"] if args.spawn else []), "--worker", str(folder), str(results), *share]
            with open(scratch / f"worker{attempt}.log", "w") as log:
                procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), results, share))
        left = []
        for proc, results, share in procs:
            proc.wait()
            done = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            rows.update({r["test"]: r for r in done})
            if len(done) < len(share):          # the worker itself died during share[len(done)]
                rows[share[len(done)]] = {"test": share[len(done)], "status": "ERROR", "seconds": 0, "exit_codes": [],
                                          "message": f"the test's worker process ended with {proc.returncode}"}
                left.append(share[len(done) + 1:])
    return rows


def _signalled(row) -> bool:
    """Whether a rank of the test ended by a signal other than SIGTERM (which PyTorch's runner
    itself sends the other ranks once one has failed)."""
    return any(isinstance(c, int) and c < 0 and c != -15 for c in row.get("exit_codes", []))


def _cell(row) -> str:
    if row is None:
        return "-"
    return row["status"] + ("!" if _signalled(row) else "")


def table(ids: list[str], runs: dict[str, dict]) -> str:
    """The plain-text table: one line per test, one column per run, then the failures' first lines."""
    names = list(runs)
    width = max(len(t) for t in ids)
    head = f"{'test':<{width}}  " + " ".join(f"{n:>{max(len(n), 6)}}" for n in names)
    lines = [head, "-" * len(head)]
    for test in ids:
        lines.append(f"{test:<{width}}  " + " ".join(f"{_cell(runs[n].get(test)):>{max(len(n), 6)}}" for n in names))
    lines += ["", "What went wrong (the failure's first line; runs with the same line grouped):"]
    for test in ids:
        by_message = {}
        for n in names:
            row = runs[n].get(test)
            if row and row["status"] not in ("pass", "skip"):
                by_message.setdefault(f"{row['status']}: {row['message']}", []).append(n)
            if row and row["status"] == "pass" and _cell(row).endswith("!"):
                by_message.setdefault(f"passed, but a rank ended by a signal: exit codes {row['exit_codes']}",
                                      []).append(n)
        for message, where in by_message.items():
            lines.append(f"  {test} [{', '.join(where)}] {message}")
    return "\n".join(lines)


def summary(ids: list[str], runs: dict[str, dict]) -> list[str]:
    """One line per run: how many pass, and for gradsync how many of Gloo's passes it keeps."""
    gloo = runs["gloo"]
    passed = [t for t in ids if gloo.get(t, {}).get("status") == "pass"]
    counts = {s: sum(1 for t in ids if gloo.get(t, {}).get("status") == s) for s in ("pass", "skip", "FAIL", "ERROR", "TIME")}
    lines = [f"gloo: {counts['pass']} of {len(ids)} pass ({counts['skip']} skip, "
             f"{counts['FAIL'] + counts['ERROR'] + counts['TIME']} fail or error)"]
    for name, rows in runs.items():
        if name != "gloo":
            kept = sum(1 for t in passed if rows.get(t, {}).get("status") == "pass")
            lines.append(f"gradsync {name}: {kept} of the {len(passed)} that pass on Gloo")
    return lines


def _versions(folder: Path) -> list[str]:
    import torch

    digests = [f"{f} sha256 {hashlib.sha256((folder / f).read_bytes()).hexdigest()[:16]}" for f in FILES]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return [f"torch {torch.__version__}; gradsync commit {commit or 'unknown'}", *digests]


def main(argv=None) -> None:
    args = _parse(argv)
    if args.worker:
        return worker(args.worker[0], args.worker[2:], args.worker[1], args.timeout, args.spawn)
    folder = tests_dir_of(args)
    chosen = profiles(args.profiles)
    ids = [t for t in list_tests(folder) if (args.lazy_init or not t.startswith(LAZY_CLASS + "."))
           and re.search(args.match, t)]
    started = time.monotonic()
    runs = {"gloo": run_profile(folder, ids, "gloo", "", args)}
    print(f"gloo: {len(ids)} tests in {time.monotonic() - started:.0f} s", file=sys.stderr)
    passing = [t for t in ids if runs["gloo"][t]["status"] == "pass"]
    for name, algorithms in chosen.items():
        started = time.monotonic()
        runs[name] = run_profile(folder, ids if args.every_test else passing, "gradsync", algorithms, args)
        print(f"{name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    text = "\n".join(["PyTorch's c10d tests (test_c10d_gloo.py) on Gloo and on the gradsync backend",
                      *_versions(folder), "profiles: " + "; ".join(f"{n} = {a or '(default: auto)'}"
                                                            for n, a in chosen.items()),
                      "", *summary(ids, runs), "", table(ids, runs)])
    print(text)
    if args.table:
        Path(args.table).write_text(text + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps({"profiles": chosen, "runs": runs}, indent=1))


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--pytorch", help="a checkout of pytorch/pytorch (its test/distributed/ is read)")
    where.add_argument("--tests-dir", help="a folder holding test_c10d_gloo.py and test_c10d_common.py")
    p.add_argument("--profiles", default="all", help="'all' or names: auto, engine, one_host, ring, ring/gloo, ...")
    p.add_argument("--match", default="", help="run only the tests whose Class.test_name matches this regex")
    p.add_argument("--lazy-init", action="store_true", help="also run ProcessGroupGlooLazyInitTest")
    p.add_argument("--every-test", action="store_true", help="run the profiles on every test, not only Gloo's passes")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds a test may take (default 90)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes per run (default 1; each test spawns 1-4 ranks)")
    p.add_argument("--spawn", action="store_true", help="start the ranks by spawn, as the tests do (default: fork)")
    p.add_argument("--out", help="write every result as JSON here")
    p.add_argument("--table", help="write the printed table here too")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker and not (args.pytorch or args.tests_dir):
        p.error("give --pytorch or --tests-dir (see the usage above for how to get PyTorch's two files)")
    if args.jobs < 1 or args.timeout <= 0:
        p.error(f"--jobs must be at least 1 and --timeout positive, got {args.jobs} and {args.timeout}")
    return args


if __name__ == "__main__":
    main()
