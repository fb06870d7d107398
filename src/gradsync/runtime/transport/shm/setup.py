"""Setting a group's segment up through its torch.distributed store, and keeping it.

The ranks first learn which of them share a host (``hosts.host_map``); the first rank of a
host creates the segment and passes its name through the group's store, every rank of the
host maps it and reports, and the creator unlinks it as soon as all have reported. Each group
keeps its ``SharedGroup`` (or the sentence saying why it has none) in its state
(``runtime.state``), for the process group object it was set up for; a group dropped there
is closed, and so is every group at exit.
"""

from __future__ import annotations

import atexit
import functools
import datetime

from ....errors import PeerError
from ...state import STATE, group_state
from ..base import group_key, group_name, store_prefix
from ..hosts import host_map
from .group import SharedGroup
from .segment import check_in, create, open_segment, remove, sweep

WHOLE, HOST = "shm", "shm host"       # the group state's slots: the whole group's segment, this host's


def shared_group(group=None, timeout: float = 60.0) -> SharedGroup | str:
    """The ``SharedGroup`` of a torch.distributed process group (set up on first use, by every
    rank together), or a sentence saying why its ranks cannot share memory.

    Example, in each rank after ``dist.init_process_group``: ``shared_group()`` is a
    ``SharedGroup`` when all ranks run on this host.
    """
    return _kept(group, True, timeout)


def host_group(group=None, timeout: float = 60.0) -> SharedGroup | str:
    """The ``SharedGroup`` of the ranks of ``group`` that run on this rank's host (set up on
    first use, by every rank of the group together, each host its own segment), or a sentence
    saying why not (this rank alone on its host, or a segment that could not be shared).

    Example, in each rank of a group of 2 hosts x 2 ranks: ``host_group().ranks`` is [0, 1]
    on the first host and [2, 3] on the second.
    """
    return _kept(group, False, timeout)


def _kept(group, whole: bool, timeout: float) -> SharedGroup | str:
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    state = group_state(group_key(group))
    slot = WHOLE if whole else HOST
    kept = state.kept(slot, pg)
    if kept is not None:
        return kept
    found = host_map(group, timeout)
    rank, size, name = dist.get_rank(group), dist.get_world_size(group), group_name(group)
    members = list(range(size)) if whole else found.ranks_on(found.host[rank])
    store = dist.distributed_c10d._get_default_store()
    if whole and found.hosts > 1:
        result = f"the ranks run on {found.hosts} hosts ({', '.join(found.names)})"
    elif len(members) == 1:
        result = f"rank {rank} is alone on its host"
    else:
        key = name if whole else f"{name}@{found.host[rank]}"
        n = state.advance(f"shm set-ups {key}")      # every rank of the host sets up alike
        result = _setup(store, f"{store_prefix()}/shm/{key}/{n}", members.index(rank), len(members), timeout, members)
    state.keep(slot, pg, result)
    return result


def _setup(store, prefix: str, rank: int, size: int, timeout: float, ranks: list[int]) -> SharedGroup | str:
    """Every rank of one host's part of a group (``ranks``: their ranks in the group; ``rank``
    and ``size`` local), together, under the store keys ``prefix``: one segment all can map?
    Returns the ``SharedGroup``, or why not (the same answer on every rank)."""
    _leave_at_exit()
    wait = datetime.timedelta(seconds=timeout)
    mm, name, problem = None, "", ""
    try:
        if rank == 0:
            sweep()
            name, mm = create(size)
            store.set(f"{prefix}/name", name)
        else:
            name = _segment_name(store, f"{prefix}/name", wait, ranks[rank], ranks[0])
            if name.startswith("!"):
                raise OSError(name[1:])
            mm = open_segment(name, size)
        check_in(mm, rank)
    except (OSError, ValueError) as exc:
        problem = str(exc) if name.startswith("!") else f"rank {ranks[rank]} could not map the segment: {exc}"
        if rank == 0:
            store.set(f"{prefix}/name", "!" + problem)
    reports = []
    try:
        store.set(f"{prefix}/opened/{rank}", problem or "ok")
        reports = _everyone(store, [f"{prefix}/opened/{r}" for r in range(size)], wait, rank, ranks)
    finally:
        if name and (rank == 0 or not reports):     # every rank has them open, or gave up (rank 0 may be dead)
            remove(name)
    problems = [p for p in reports if p != "ok"]
    if problems:
        if mm is not None:
            mm.close()
        return problems[0]
    return SharedGroup(rank, size, mm, name, ranks)


def _everyone(store, keys: list[str], wait, rank: int, ranks: list[int]) -> list[str]:
    """What every rank wrote under ``keys``, once all have."""
    try:
        store.wait(keys, wait)
        return [store.get(k).decode() for k in keys]
    except Exception:          # a rank never came (or rank 0, the store's host, died)
        raise _absent(store, keys, ranks[rank], ranks) from None


def _absent(store, keys: list[str], rank: int, ranks: list[int]) -> PeerError:
    """The PeerError of a set-up some rank never joined: the first whose key is missing
    (``rank`` and the missing named by their ranks in the group)."""
    try:
        missing = [ranks[int(k.rsplit("/", 1)[1])] for k in keys if not store.check([k])]
    except Exception:
        missing = None
    if missing is None:
        return PeerError(f"rank {rank}: rank 0 is unreachable (it hosts the rendezvous store) while setting up "
                         f"shared memory", peer=0, op="setup")
    peer = missing[0] if missing else None
    return PeerError(f"rank {rank}: rank(s) {missing} did not join the shared-memory set-up before the timeout",
                     peer=peer, op="setup")


def _segment_name(store, key: str, wait, rank: int, creator: int) -> str:
    """The segment's name, which its creator (the host's first rank) publishes."""
    try:
        store.wait([key], wait)
        return store.get(key).decode()
    except Exception:
        raise PeerError(f"rank {rank}: rank {creator} did not publish the shared-memory segment before the "
                        f"timeout", peer=creator, op="setup") from None


@functools.cache
def _leave_at_exit() -> None:
    """Close every segment this process mapped when it exits; registered by the first set-up
    (once: the cache holds its one call), not at import."""
    atexit.register(_leave_all)


def _leave_all():
    for kept in STATE.objects(WHOLE) + STATE.objects(HOST):
        kept.close()
