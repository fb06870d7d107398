"""What the local launcher's workers report, and a failed job told in one line: who failed
first, when, doing what, and what became of the others (``launch.run`` uses it).

>>> _exit(-9), _ranks([0, 2])
('killed by SIGKILL', 'ranks 0, 2')
"""

from __future__ import annotations

import queue as queue_module
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from ..errors import GradsyncError

STARTING = "starting (importing, before the rendezvous)"
MEETING = "meeting the others at the rendezvous store"


def current(phase) -> str:
    """What a worker's slot (a shared byte array) says it is doing: ``current(None) == "running"``."""
    return phase.value.decode(errors="replace") if phase is not None else "running"


def describe_failure(exc: BaseException, what: str) -> str:
    """One worker's failure for the launcher's report: gradsync's own errors as they are, the
    engine's (Gloo's ``RuntimeError``: a peer's connection closed or a timeout) in gradsync's
    words with what the rank was doing, anything else with a short traceback.

    >>> describe_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1"), "waiting at a barrier")
    'PeerError: the engine (torch.distributed) failed while waiting at a barrier: a peer closed its connection'
    """
    if isinstance(exc, GradsyncError):
        return f"{type(exc).__name__}: {exc}"
    text = str(exc)
    for marker, why in ENGINE_FAILURES:
        if isinstance(exc, RuntimeError) and marker in text.lower():
            return f"PeerError: the engine (torch.distributed) failed while {what}: {why}"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt: interrupted"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}\n" + traceback.format_exc(limit=6)


# how the engine's errors say that a peer went away (matched without case), and what that means
ENGINE_FAILURES = (("connection closed by peer", "a peer closed its connection"),
                   ("connection reset by peer", "a peer's connection was reset"),
                   ("connection refused", "a peer refused the connection (it is gone)"),
                   ("timed out", "a peer did not answer within the timeout"),
                   ("timeout", "a peer did not answer within the timeout"),
                   ("broken pipe", "a peer's connection broke"), ("gloo", "the engine's connection to a peer failed"))


def engine_messages(folder: str, replay: bool, keep: bool) -> str | None:
    """The workers' engine messages: replayed on stderr (a healthy run), kept and the folder
    returned (a failure, when there are any), else removed with their folder."""
    texts = [p.read_text(errors="replace") for p in sorted(Path(folder).glob("rank*.log"))]
    if replay and any(texts):
        sys.stderr.write("".join(texts))
    if keep and any(texts):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    return None


class Job:
    """The workers' reports as they arrive: results, errors, and when and how each rank failed."""

    def __init__(self, procs, results, phases, timeout, job_timeout, tolerate):
        self.procs, self.results, self.phases, self.tolerate = procs, results, phases, tolerate
        self.timeout, self.started = timeout, time.monotonic()
        self.deadline = self.started + job_timeout
        self.out, self.errors, self.done = [None] * len(procs), {}, set()
        self.failures: list[tuple[float, int, str]] = []       # (seconds after the start, rank, what it did)

    def collect(self) -> None:
        """Read reports until every rank has one, the job's deadline, or (unless tolerating)
        ``timeout`` + 2 s after the first failure (at once when that rank died still starting)."""
        while len(self.done) < len(self.procs) and time.monotonic() < self.deadline:
            try:
                rank, status, value = self.results.get(timeout=0.2)
            except queue_module.Empty:
                self._notice_deaths()
                continue
            self.done.add(rank)
            if status == "ok":
                self.out[rank] = value
            else:
                self._failed(rank, value, "peer" if value.startswith("PeerError") else "reported")
        for r in range(len(self.procs)):
            if r not in self.done:
                phase = current(self.phases[r])
                self.errors[r] = (f"stopped by the launcher while {phase}" if self.failures
                                  else f"no result before the timeout (it hung while {phase})")

    def _notice_deaths(self) -> None:
        for r, p in enumerate(self.procs):     # a process gone without a word has died
            if r not in self.done and not p.is_alive() and self.results.empty():
                time.sleep(0.2)
                if self.results.empty():
                    self.done.add(r)
                    self._failed(r, f"died ({_exit(p.exitcode)}) while {current(self.phases[r])}", "silent")

    def _failed(self, rank: int, message: str, kind: str) -> None:
        """Note a failure; ``kind``: "silent" (died without a word), "reported" (its own error)
        or "peer" (a PeerError: it saw another fail)."""
        self.errors[rank] = message
        self.failures.append((time.monotonic() - self.started, rank, kind))
        if self.tolerate or len(self.failures) > 1:
            return
        early = kind == "silent" and current(self.phases[rank]) in (STARTING, MEETING)
        self.deadline = min(self.deadline, time.monotonic() + (0.5 if early else self.timeout + 2))

    def summary(self) -> str:
        """One line: the first failure (who, when, doing what), then what became of the others."""
        order = ("silent", "reported", "peer")
        at, first, _ = min(self.failures, key=lambda f: (order.index(f[2]), f[0]))
        head = f"rank {first}: {_first_line(self.errors[first])} (the first to fail, {at:.1f} s after the start)"
        rest: dict[str, list[int]] = {}
        for r, msg in sorted(self.errors.items()):
            if r != first:        # the others' PeerErrors say one thing: they saw it fail
                key = "stopped: " + _first_line(msg) if msg.startswith("PeerError") else _first_line(msg)
                same = next((k for k in rest if k.startswith("stopped: PeerError")), key) \
                    if key.startswith("stopped: PeerError") else key
                rest.setdefault(same, []).append(r)
        others = "; ".join(f"{_ranks(ranks)} {msg}" if msg.startswith("stopped") else f"{_ranks(ranks)}: {msg}"
                           for msg, ranks in rest.items())
        return f"{len(self.errors)} of {len(self.procs)} workers failed: {head}" + (f"; then {others}" if others else "")


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else "no message"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _exit(code) -> str:
    """A process's end in words: ``_exit(-9)`` is 'killed by SIGKILL'."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
