"""A gradsync collective as torch.distributed sees it: a ``Work`` and, on failure, an error in
torch's terms (``RankFailure``: both gradsync's ``PeerError`` and torch's ``DistBackendError``).
"""

from __future__ import annotations

import re
import time

import torch
import torch.distributed as dist

from ..errors import PeerError
from ..runtime.flight import RECORDER
from ..runtime.pending import Done, Pending, done_future, failing_future


class RankFailure(PeerError, dist.DistBackendError):
    """A rank of a gradsync-backend group died or stalled during a collective. ``peer`` names it
    (as a rank of the group); the collective's result is undefined. Caught as torch's
    ``DistBackendError`` (what elastic agents and training loops catch) or gradsync's ``PeerError``.

    >>> isinstance(RankFailure("rank 0: receive from rank 2 failed", peer=2), dist.DistBackendError)
    True
    """


def in_torch_terms(exc: BaseException, ranks: tuple | None = None) -> BaseException:
    """The error to hand to torch: a ``PeerError`` becomes a ``RankFailure`` with its message,
    peer and operation; anything else stays as it is. ``ranks``: the group's global ranks, for a
    subgroup (a DeviceMesh's, ``new_group``'s): its message and ``peer`` then name every rank by
    its global rank (torchrun's RANK), not by its place in the subgroup.

    >>> type(in_torch_terms(PeerError("lost", peer=1))).__name__
    'RankFailure'
    >>> e = in_torch_terms(PeerError("rank 0: rank 1 died; rank(s) [1] missing", peer=1), (2, 3)); e.peer, str(e)
    (3, 'rank 2: rank 3 died; rank(s) [3] missing (ranks are global: this group holds ranks 2, 3)')
    """
    if not isinstance(exc, PeerError) or (isinstance(exc, RankFailure) and ranks is None):
        return exc
    if ranks is None:
        return RankFailure(str(exc), peer=exc.peer, op=exc.op)
    def one(r: str) -> str:
        return str(ranks[int(r)]) if int(r) < len(ranks) else r

    text = re.sub(r"\brank (\d+)\b", lambda m: f"rank {one(m.group(1))}", str(exc))
    text = re.sub(r"rank\(s\) \[([\d, ]+)\]",
                  lambda m: "rank(s) [" + ", ".join(one(r) for r in m.group(1).split(", ")) + "]", text)
    peer = exc.peer if exc.peer is None or exc.peer >= len(ranks) else ranks[exc.peer]
    return RankFailure(f"{text} (ranks are global: this group holds ranks {', '.join(map(str, ranks))})",
                       peer=peer, op=exc.op)


class Work(dist.Work):
    """The ``Work`` of a collective of a gradsync group: ``wait()`` blocks until it is done and
    raises its error in torch's terms; ``get_future()`` is completed with ``result`` (what
    torch's own backends complete theirs with: the output tensors), or fails so that C++ readers
    (DDP's reducer) see an error too. ``pending`` is the collective's ``runtime.pending.Pending``
    (None: it has ended well).

    >>> w = Work(None, [torch.ones(1)]); w.wait(), w.is_completed(), w.get_future().value()[0].tolist()
    (True, True, [1.0])
    """

    def __init__(self, pending: Pending | None, result, ranks: tuple | None = None):
        super().__init__()
        self._pending, self._result, self._ranks = pending, result, ranks

    def wait(self, timeout=None) -> bool:
        if self._pending is not None:
            try:
                self._pending.wait()
            except BaseException as exc:
                raise in_torch_terms(exc, self._ranks) from None
        return True

    def is_completed(self) -> bool:
        return self._pending is None or self._pending.done()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        error = None if self._pending is None else self._pending.error()
        return None if error is None else in_torch_terms(error, self._ranks)

    def result(self):
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        if self._pending is None:
            return done_future(self._result)
        if self._pending.done():
            error = self.exception()
            return failing_future(error) if error is not None else done_future(self._result)
        return self._pending.future(self._result, lambda exc: in_torch_terms(exc, self._ranks))


def failed(error: BaseException, result) -> Work:
    """A ``Work`` that has ended with ``error`` (a collective refused at once, or after a failure)."""
    return Work(Done(None, in_torch_terms(error)), result)


class Then:
    """A ``Pending`` that runs ``after()`` once its inner one has ended well."""

    __slots__ = ("inner", "after", "_ran")

    def __init__(self, inner, after):
        self.inner, self.after, self._ran = inner, after, False

    def wait(self):
        out = self.inner.wait()
        if not self._ran:
            self._ran = True
            self.after()
        return out

    def done(self):
        return self.inner.done()

    def error(self):
        return self.inner.error()

    def future(self, value=None, translate=None):
        inner = self.inner.future(value, translate)

        def settle(f):
            f.value()
            self.wait()
            return f.value()

        return inner.then(settle)


class Joined(dist.Work):
    """One ``Work`` for several, done when all are (the first error, if any), its future
    completed with ``result``."""

    def __init__(self, works: list, result):
        super().__init__()
        self._works, self._result = works, result

    def wait(self, timeout=None) -> bool:
        for work in self._works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self):
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def get_future(self) -> torch.futures.Future:
        result = self._result

        def settle(f):
            for each in f.value():
                each.value()                # raises the first failure, in C++ terms
            return result

        return torch.futures.collect_all([w.get_future() for w in self._works]).then(settle)


class EngineWork(dist.Work):
    """The engine's own ``Work`` for a call it runs as it came: its results and future exactly
    Gloo's; ``wait()`` names the failed rank as a ``RankFailure`` (Gloo says only that a
    connection closed) and ends its flight recorder ``entry``."""

    def __init__(self, work, group_ref, what: str, entry=None, ranks: tuple | None = None):
        super().__init__()
        self._inner, self._group, self._what, self._entry, self._ranks = work, group_ref, what, entry, ranks
        self._started = time.monotonic()

    def wait(self, timeout=None) -> bool:
        try:
            out = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        except BaseException as exc:
            error = self._named(exc)
            self._ended(error)
            raise error from None
        self._ended(None)
        return out

    def _ended(self, error) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            RECORDER.end(entry, error)

    def _named(self, exc):
        group = self._group()
        if group is None:
            return in_torch_terms(exc, self._ranks)
        from ..runtime.transport.distributed import named_failure

        return in_torch_terms(named_failure(group, self._what, exc, None, self._started), self._ranks)

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def result(self):
        return self._inner.result()

    def get_future(self) -> torch.futures.Future:
        return self._inner.get_future()

    def source_rank(self) -> int:
        return self._inner.source_rank()
