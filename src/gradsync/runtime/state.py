"""What this process keeps for each process group it is a rank of, with one owner and a bound.

A process can be a rank of several groups at once (the world, DDP's, ``new_group`` subgroups,
a DeviceMesh's). For each, gradsync keeps a few things that must live longer than one
collective: counters that every rank of the group advances alike and that name store keys
(collectives started, host exchanges, shared-memory set-ups), and objects made once per group
(its progress engine, its host map, its shared-memory segment). They all live here, in one
``GroupState`` per group, reached through ``group_state(key)``:

- one lock guards every group's counters and objects, so two threads of one rank cannot
  advance a counter past each other;
- one bound: at most ``GROUPS_LIMIT`` groups are kept; beyond that the least recently used
  group that is not busy is dropped, each object's ``close()`` (where it has one) called.
  Its counters are not dropped: they name store keys, and a rank that started one again at 1
  (it dropped the group, another rank did not, or the group's store keys of the first time are
  still there) would read keys written long ago. They are a few integers per group key.

An object made for one process group *object* (its host map, its segment) is kept with that
object as its owner (``keep``) and found again only for it (``kept``): a group destroyed and
made again has the same key, and is not the same group.

A group's ``key`` is the same text in every rank (``"torch/world"``, ``"torch/0-2-3"``), so a
counter advanced once per collective names the same store key on every rank.

>>> s = ProcessState(limit=2)
>>> s.group("torch/world").advance("collectives"), s.group("torch/world").advance("collectives")
(1, 2)
>>> s.group("torch/0-1").slot("hosts", lambda: "made once"), s.group("torch/0-1").slot("hosts", lambda: "again")
('made once', 'made once')
>>> _ = s.group("torch/1-2"); sorted(s.keys())            # the least recently used one is dropped
['torch/0-1', 'torch/1-2']
>>> s.group("torch/world").advance("collectives")          # made again, it counts on
3
"""

from __future__ import annotations

import threading
from collections import OrderedDict

GROUPS_LIMIT = 64          # groups kept per process; the least recently used idle one goes beyond


class GroupState:
    """One group's counters and per-group objects; made by ``ProcessState``."""

    def __init__(self, key: str, lock: threading.RLock, counters: dict[str, int] | None = None):
        self.key = key
        self._lock = lock
        self._counters: dict[str, int] = {} if counters is None else counters    # kept by ProcessState
        self._slots: dict[str, object] = {}

    def advance(self, counter: str) -> int:
        """Add one to ``counter`` and return it (1 the first time): every rank advances it at
        the same points, so the value names the same store key on every rank."""
        with self._lock:
            self._counters[counter] = value = self._counters.get(counter, 0) + 1
            return value

    def slot(self, name: str, make):
        """The group's object ``name``, made by ``make()`` the first time. ``make`` runs under
        the lock: keep it to local work."""
        with self._lock:
            obj = self._slots.get(name)
            if obj is None:
                obj = self._slots[name] = make()
            return obj

    def peek(self, name: str):
        """The group's object ``name`` if one was made, else None."""
        with self._lock:
            return self._slots.get(name)

    def kept(self, name: str, owner):
        """The object kept as ``name`` for ``owner`` (a process group object) by ``keep``, or
        None: one kept for another object of the same key does not count.

        >>> g = ProcessState().group("torch/world"); pg = object()
        >>> g.keep("hosts", pg, "map"); g.kept("hosts", pg), g.kept("hosts", object())
        ('map', None)
        """
        with self._lock:
            entry = self._slots.get(name)
        return entry.value if isinstance(entry, Kept) and entry.owner is owner else None

    def keep(self, name: str, owner, value) -> None:
        """Keep ``value`` as ``name``, for ``owner`` only. One kept for another owner is replaced
        without being closed: a collective of that other group object may still be using it."""
        with self._lock:
            self._slots[name] = Kept(owner, value)

    def busy(self) -> bool:
        """Whether any of its objects says it is busy (a progress engine with work queued)."""
        with self._lock:
            return any(getattr(obj, "busy", lambda: False)() for obj in self._slots.values())

    def close(self) -> None:
        with self._lock:
            objects, self._slots = list(self._slots.values()), {}
        for obj in objects:
            if hasattr(obj, "close"):
                obj.close()


class Kept:
    """A value made for one process group object (``owner``): busy and closed with its group's
    state as the value is (where it has ``busy()`` or ``close()``)."""

    __slots__ = ("owner", "value")

    def __init__(self, owner, value):
        self.owner, self.value = owner, value

    def busy(self) -> bool:
        return getattr(self.value, "busy", lambda: False)()

    def close(self) -> None:
        if hasattr(self.value, "close"):
            self.value.close()


class ProcessState:
    """Every group's ``GroupState``, least recently used first; at most ``limit`` of them."""

    def __init__(self, limit: int = GROUPS_LIMIT):
        self.limit = limit
        self._lock = threading.RLock()
        self._groups: OrderedDict[str, GroupState] = OrderedDict()
        self._counters: dict[str, dict[str, int]] = {}      # by group key, never dropped

    def group(self, key: str) -> GroupState:
        """The state of group ``key``, made on first use."""
        dropped = []
        with self._lock:
            state = self._groups.get(key)
            if state is None:
                state = self._groups[key] = GroupState(key, self._lock, self._counters.setdefault(key, {}))
                for old in [k for k, g in self._groups.items() if k != key and not g.busy()]:
                    if len(self._groups) <= self.limit:
                        break
                    dropped.append(self._groups.pop(old))
            self._groups.move_to_end(key)
        for old in dropped:
            old.close()
        return state

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._groups)

    def objects(self, name: str) -> list:
        """Every kept group's object ``name`` (e.g. to close them all at exit)."""
        with self._lock:
            return [obj for obj in (g.peek(name) for g in self._groups.values()) if obj is not None]

    def forget(self, key: str) -> None:
        """Drop group ``key`` and close its objects (tests; a destroyed group); its counters stay."""
        with self._lock:
            state = self._groups.pop(key, None)
        if state is not None:
            state.close()

    def clear(self) -> None:
        """Drop every group (tests; a process about to exit); counters stay."""
        for key in self.keys():
            self.forget(key)


STATE = ProcessState()       # this process's one instance


def group_state(key: str) -> GroupState:
    """This process's state for group ``key``: ``group_state("torch/world").advance("collectives")``."""
    return STATE.group(key)
