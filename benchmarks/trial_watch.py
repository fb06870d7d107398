"""What the trials read from the process table and /dev/shm, without the processes' help.

A trial's processes are those of its sessions: torchrun is started as a session leader (the
session id is its pid), and it starts each worker as the leader of a session of its own, which
the worker's children inherit and keep after torchrun is gone. A worker's exit status is read
from its zombie's ``/proc/<pid>/stat`` (field 52, ``exit_code``, as ``waitpid`` reports it)
before torchrun reaps it: the harness sees a SIGSEGV as a SIGSEGV even where torchrun never
says so. Segments are attributed by name: gradsync names each ``gradsync-<uid>-<pid>-<random>``
after the process that made it.

Example::

    procs = sessions({os.getsid(0)})       # {pid: Proc} of this process's session
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

SHM = "/dev/shm"
SEGMENT = re.compile(r"^gradsync-(\d+)-(\d+)-")


@dataclass
class Proc:
    """One process as /proc shows it now: ``state`` R/S/D/T (stopped)/Z (zombie)/..."""

    pid: int
    ppid: int
    sid: int
    state: str
    exit_status: int      # waitpid's status word; meaningful for a zombie only
    threads: int


def stat(pid: int) -> Proc | None:
    """``pid``'s /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return Proc(pid, int(fields[1]), int(fields[3]), fields[0], int(fields[49]), int(fields[17]))


def sessions(sids, parent: int | None = None) -> dict[int, Proc]:
    """Every process of the sessions ``sids`` now (zombies included), and every child of ``parent``."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = stat(int(name))
            if p is not None and (p.sid in sids or p.ppid == parent):
                out[p.pid] = p
    return out


def environ(pid: int) -> dict[str, str]:
    """``pid``'s environment as it started (empty if unreadable or gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def exit_of(status: int) -> dict:
    """waitpid's status word as {"code": n} or {"signal": "SIGSEGV"}.

    >>> exit_of(11), exit_of(3 << 8), exit_of(6 | 0x80)
    ({'signal': 'SIGSEGV'}, {'code': 3}, {'signal': 'SIGABRT'})
    """
    sig = status & 0x7F
    if sig:
        return {"signal": signal.Signals(sig).name}
    return {"code": status >> 8}


def segments(pids=None) -> set[str]:
    """gradsync's segments (and doorbell folders) in /dev/shm; with ``pids``, those made by them."""
    out = set()
    for name in os.listdir(SHM):
        m = SEGMENT.match(name)
        if m and (pids is None or int(m.group(2)) in pids):
            out.add(name)
    return out


def kill(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` if it is still there; whether it was."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class Watch:
    """The workers of one torchrun (pid ``sid``, a session leader), polled: for each (by pid) its
    rank and attempt (from its environment), when it was seen over, its exit, whether it was seen
    stopped. ``sids`` are the trial's sessions (torchrun's and each worker's); ``seen`` holds
    every pid of them ever seen (the segments' possible makers).

    Example: ``w = Watch(proc.pid, "trial_job.py"); w.poll(); w.workers``.
    """

    def __init__(self, sid: int, script: str):
        self.sid, self.script = sid, script
        self.workers: dict[int, dict] = {}
        self.seen: set[int] = set()
        self.sids: set[int] = {sid}

    def poll(self) -> None:
        now = time.time()
        procs = sessions(self.sids, parent=self.sid)     # a worker just started is torchrun's child
        self.seen.update(procs)
        for pid, p in procs.items():
            w = self.workers.get(pid)
            if w is None and p.ppid == self.sid and p.state not in "ZX" and self.script in cmdline(pid):
                env = environ(pid)     # forked but not yet exec'ed: torchrun's own (no RANK); next poll
                if "RANK" not in env:
                    continue
                self.sids.add(p.sid)
                w = self.workers[pid] = {"pid": pid, "rank": int(env["RANK"]),
                                         "attempt": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                         "ended": None, "exit": None, "stopped": False}
            if w is None:
                continue
            w["stopped"] = w["stopped"] or p.state == "T"
            if p.state in "ZX" and w["ended"] is None:
                w["ended"], w["exit"] = now, exit_of(p.exit_status)
        for pid, w in self.workers.items():
            if pid not in procs and w["ended"] is None:
                w["ended"] = now               # reaped between two polls: its exit unknown

    def victim(self, fault) -> dict | None:
        """The first attempt's worker that the fault struck (its rank), if seen."""
        return next((w for w in self.workers.values() if fault and w["rank"] == fault["rank"]
                     and w["attempt"] == 0), None)

    def survivors_over(self, fault, size: int) -> bool:
        """Whether every rank but the victim of the first attempt was seen and is over."""
        first = [w for w in self.workers.values() if w["attempt"] == 0]
        if len({w["rank"] for w in first}) < size:
            return False
        victim = self.victim(fault)
        return all(w["ended"] is not None for w in first if w is not victim) and \
            (victim is None or victim["ended"] is not None or victim["stopped"])

    def stopped_victim(self, fault) -> int | None:
        """The victim's pid while it is stopped (SIGSTOP) and not yet resumed."""
        v = self.victim(fault)
        if v and v["ended"] is None and not v.get("resumed") and stat(v["pid"]) and stat(v["pid"]).state == "T":
            return v["pid"]
        return None
