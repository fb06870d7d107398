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


class EngineWork(dist.Work):
    """The ``Work`` of a collective the engine runs on CPU tensors: ``wait()`` waits on the
    engine's own Work in the caller's thread and raises ``translate(error)``; ``ended(error or
    None)`` is called once, by whoever first sees the end (``wait``, ``exception``, the future
    ``get_future`` builds when asked). No callback runs on the engine's thread: on shared cores
    each hop through one costs a thread wake-up, about as long as a 4 KB collective.

    >>> class Done:
    ...     def wait(self): return True
    ...     def is_completed(self): return True
    >>> EngineWork(Done(), [torch.ones(1)], lambda e: e, ended=print).wait()
    None
    True
    """

    def __init__(self, inner, result, translate=in_torch_terms, ended=None):
        super().__init__()
        self._inner, self._result, self._translate = inner, result, translate
        self._ended, self._future = ended, None

    def _end(self, exc) -> None:
        ended, self._ended = self._ended, None
        if ended is not None:
            ended(exc)

    def wait(self, timeout=None) -> bool:
        try:
            self._inner.wait()
        except BaseException as exc:        # torch's own error, said as gradsync says it
            self._end(exc)
            raise self._translate(exc) from None
        self._end(None)
        return True

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        if not self._inner.is_completed():
            return None
        try:
            self.wait()
            return None
        except BaseException as exc:
            return exc

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            inner = self._inner.get_future()
            inner.add_done_callback(lambda f: self._end(error_of(f)))
            self._future = Work(inner, self._result, self._translate).get_future()
        return self._future


def error_of(future: torch.futures.Future):
    """The error a completed ``future`` ended with, or None."""
    try:
        future.value()
    except BaseException as exc:
        return exc
    return None
