"""A gradsync collective as torch.distributed sees it: a ``Work`` and, on failure, an error in
torch's terms (``RankFailure``: both gradsync's ``PeerError`` and torch's ``DistBackendError``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import PeerError


class RankFailure(PeerError, dist.DistBackendError):
    """A rank of a gradsync-backend group died or stalled during a collective. ``peer`` names it
    (as a rank of the group); the collective's result is undefined. Caught as torch's
    ``DistBackendError`` (what elastic agents and training loops catch) or gradsync's ``PeerError``.

    >>> isinstance(RankFailure("rank 0: receive from rank 2 failed", peer=2), dist.DistBackendError)
    True
    """


def in_torch_terms(exc: BaseException) -> BaseException:
    """The error to hand to torch: a ``PeerError`` becomes a ``RankFailure`` with its message,
    peer and operation; anything else stays as it is.

    >>> type(in_torch_terms(PeerError("lost", peer=1))).__name__
    'RankFailure'
    """
    if isinstance(exc, PeerError) and not isinstance(exc, RankFailure):
        return RankFailure(str(exc), peer=exc.peer, op=exc.op)
    return exc


class Work(dist.Work):
    """The ``Work`` of a collective run by gradsync: ``wait()`` blocks until it is done and
    raises its ``RankFailure``; ``get_future()`` is completed with ``result`` (what torch's own
    backends complete theirs with: the output tensors). ``translate(error)`` turns a failure
    into the error handed on (``in_torch_terms`` by default).

    >>> f = torch.futures.Future(); w = Work(f, [torch.ones(1)]); f.set_result(None); w.wait()
    True
    """

    def __init__(self, future: torch.futures.Future, result, translate=in_torch_terms):
        super().__init__()
        self._future = torch.futures.Future()
        self._result, self._translate = result, translate
        future.add_done_callback(self._done)

    def _done(self, inner: torch.futures.Future) -> None:
        try:
            inner.value()
        except BaseException as exc:       # carried to whoever waits, as torch's error
            self._future.set_exception(self._translate(exc))
            return
        self._future.set_result(self._result)

    def wait(self, timeout=None) -> bool:
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
            return True
        except BaseException:
            return False

    def exception(self):
        try:
            self._future.value()
            return None
        except BaseException as exc:
            return exc

    def get_future(self) -> torch.futures.Future:
        return self._future


def done(result) -> Work:
    """A ``Work`` already complete with ``result`` (a one-rank group's collective).

    >>> done([]).is_completed()
    True
    """
    future = torch.futures.Future()
    future.set_result(None)
    return Work(future, result)
