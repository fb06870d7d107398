"""The Gloo engine under a gradsync group, made within a bound.

``ProcessGroupGloo``'s constructor connects every pair of ranks (Gloo's ``connectFullMesh``).
A rank that dies in the middle of it can hold the others there for good: a random kill
campaign found two survivors still inside it 26 s after the kill at a 10 s timeout, and a
third ending at 25 s with Gloo's own "Connect timeout"; others got Gloo's "Connection
refused", naming no rank. So the engine is made on a thread of its own, each rank first
posts its host and process to the store, and a rank whose engine is not made within the
group's timeout (plus ``MARGIN_S``), or fails to connect, names the rank whose process is
gone, as every other failure of the group does.
"""

from __future__ import annotations

import datetime
import re
import threading
import time

import torch.distributed as dist

from ..runtime.transport import hosts
from .work import RankFailure

MARGIN_S = 2.0        # past the group's timeout, as a failed collective's naming allows
LOOK_EVERY_S = 0.25   # while the engine is being made, how often the ranks' records are read


def make_gloo(store, prefix: str, rank: int, size: int, timeout: datetime.timedelta):
    """The group's Gloo engine on ``PrefixStore(prefix, store)``, or a ``RankFailure`` within
    ``timeout`` + 2 s naming the rank that never joined or died while the ranks connected.

    Example (each rank of a group, its store from torch)::

        engine = make_gloo(store, "gradsync/gloo/0/", rank, size, datetime.timedelta(seconds=30))
    """
    whereabouts = dist.PrefixStore(prefix + "whereabouts/", store)
    whereabouts.set(str(rank), hosts.record())
    made: list = []

    def make():
        try:
            made.append(dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout))
        except BaseException as exc:          # noqa: BLE001 - handed to the caller's thread
            made.append(exc)

    thread = threading.Thread(target=make, daemon=True, name="gradsync-gloo-setup")
    thread.start()
    thread.join(LOOK_EVERY_S)
    seen: dict[int, bytes] = {}           # read while the store lives: its host, rank 0, may leave first
    until = time.monotonic() + timeout.total_seconds() + MARGIN_S
    while thread.is_alive() and time.monotonic() < until:
        _read_whereabouts(whereabouts, size, seen)
        posted = _notice(whereabouts)
        if posted is not None:            # another rank found who failed: Gloo may hold this one for good
            raise RankFailure(f"rank {rank}: setup abandoned: {posted[1]}", peer=posted[0], op="setup")
        thread.join(LOOK_EVERY_S)
    if made and not isinstance(made[0], BaseException):
        return made[0]
    raise _named(made[0] if made else None, whereabouts, seen, rank, size, timeout.total_seconds())


def _named(error, whereabouts, seen: dict, rank: int, size: int, seconds: float) -> BaseException:
    """The error for an engine that failed with ``error`` (None: was not made in time): the
    rank the first rank to look found gone, posted for the others (first writer wins)."""
    if isinstance(error, dist.DistStoreError):     # a rank never posted its address
        text = str(error)
        missing = [int(k) for k in re.findall(r"/(\d+)(?=,|\s|$)", text.partition("keys:")[2])]
        if not missing:                  # a store whose error names no key: who never posted here
            _read_whereabouts(whereabouts, size, seen)
            missing = [r for r in range(size) if r != rank and r not in seen]
        return RankFailure(f"rank {rank}: rank(s) {missing} did not join the group within its timeout "
                           f"({seconds:g} s): {text.splitlines()[0][:200]}",
                           peer=missing[0] if missing else None, op="setup")
    _read_whereabouts(whereabouts, size, seen)
    gone = dead_ranks(seen, rank, size)
    if not gone and error is not None:   # Gloo's own error, no rank of this host gone: as it is
        return error
    why = f"Gloo's error: {str(error).splitlines()[0][:200]}" if error is not None else \
        f"its connections were not all made within the group's timeout ({seconds:g} s) + {MARGIN_S:g} s"
    who = f"rank(s) {gone} died" if gone else "a rank of another host failed or stalled"
    failure = RankFailure(f"rank {rank}: {who} while the group's ranks connected ({why})",
                          peer=gone[0] if gone else None, op="setup")
    try:
        whereabouts.compare_set("failure", "", f"{failure.peer}|{failure}")
        posted = _notice(whereabouts)
    except Exception:                    # noqa: BLE001 - the store is gone with its host
        posted = None
    if posted is None or str(posted[1]) == str(failure):
        time.sleep(2 * LOOK_EVERY_S)     # the others read it before this rank leaves with the store
        return failure
    return RankFailure(f"rank {rank}: setup abandoned: {posted[1]}", peer=posted[0], op="setup")


def _notice(whereabouts) -> tuple[int | None, str] | None:
    """The failure a rank posted while the group was set up, as (rank or None, message)."""
    try:
        if not whereabouts.check(["failure"]):
            return None
        peer, _, text = whereabouts.get("failure").decode().partition("|")
    except Exception:                    # noqa: BLE001 - the store is gone with its host
        return None
    return (None if peer == "None" else int(peer)), text


def _read_whereabouts(whereabouts, size: int, seen: dict) -> None:
    """Add to ``seen`` the records of the ranks that have posted theirs since the last look."""
    try:
        for r in range(size):
            if r not in seen and whereabouts.check([str(r)]):
                seen[r] = whereabouts.get(str(r))
    except Exception:                     # noqa: BLE001 - the store is gone with its host: keep what was read
        pass


def dead_ranks(seen: dict, rank: int, size: int) -> list[int]:
    """The ranks of this host, among those whose records were ``seen``, whose processes are
    gone (a process of another host cannot be looked at from here)."""
    me = hosts.record()          # a rank not seen is taken as this process: alive, never named
    found = hosts.from_identities([seen.get(r, me) for r in range(size)])
    return [r for r in range(size) if r != rank and found.dead(r, found.host[rank])]
