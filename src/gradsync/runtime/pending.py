"""A collective's outcome as its caller holds it: done already, queued on the group's progress
thread, or running on the engine; and the futures handed to torch, which fail the way torch's
C++ side sees.

Why the futures need care: a Python ``torch.futures.Future``'s ``set_exception`` stores the
exception as the future's *value* (with a function that raises it when Python unwraps it). C++
readers never unwrap it: DDP's reducer took such a value for its bucket's result and read a
tensor out of an exception object (``c10d::detail::parseCppCommHookResult``, SIGSEGV on every
survivor of a dead rank), and a comm hook's future reached DDP as "Unable to cast ... to
Tensor". ``failing_future`` fails a future in C++ terms: the error is raised inside a callback
of ``then``, which torch records with ``setError``; every reader, C++ or Python, then gets an
exception (a ``RuntimeError`` whose text is gradsync's message: torch keeps the words, not the
type).
"""

from __future__ import annotations

import torch


def _raise_inner(future: torch.futures.Future):
    return future.value()        # raises the inner future's error inside ``then``: a C++ error


def failing_future(error: BaseException) -> torch.futures.Future:
    """A completed future that fails with ``error`` for every reader, C++ (DDP) included.

    >>> f = failing_future(ValueError("rank 2 died")); f.done()
    True
    >>> try:
    ...     f.wait()
    ... except RuntimeError as e:
    ...     print("rank 2 died" in str(e))
    True
    """
    inner = torch.futures.Future()
    outer = inner.then(_raise_inner)
    inner.set_exception(error)
    return outer


def done_future(value) -> torch.futures.Future:
    """A completed future holding ``value``: ``done_future([1]).value()`` is ``[1]``."""
    future = torch.futures.Future()
    future.set_result(value)
    return future


def torch_future(inner: torch.futures.Future, value, translate=None) -> torch.futures.Future:
    """A future completed with ``value`` when ``inner`` completes, or failed in C++ terms with
    ``inner``'s error (``translate(error)`` first, if given)."""

    def settle(f):
        try:
            result = f.value()
        except BaseException as exc:
            raise (translate(exc) if translate is not None else exc) from None
        return result if value is None else value

    return inner.then(settle)


class Pending:
    """A collective started with ``async_op``: ``wait()`` returns its result or raises its
    error (the caller's thread), ``done()`` says whether it ended, ``future(value)`` is a torch
    future completed with ``value`` (default: the result) or failed in C++ terms."""

    __slots__ = ()

    def wait(self):
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def error(self) -> BaseException | None:
        """The error it ended with, None while it runs or when it succeeded."""
        raise NotImplementedError

    def future(self, value=None, translate=None) -> torch.futures.Future:
        """A torch future of the result (or ``value``); it fails with ``translate(error)``."""
        raise NotImplementedError


class Done(Pending):
    """A collective that has ended (run inline): its result, or its error.

    >>> Done(3).wait(), Done(3).future().value(), Done(3).done()
    (3, 3, True)
    """

    __slots__ = ("result", "_error")

    def __init__(self, result=None, error: BaseException | None = None):
        self.result, self._error = result, error

    def wait(self):
        if self._error is not None:
            raise self._error
        return self.result

    def done(self) -> bool:
        return True

    def error(self):
        return self._error

    def future(self, value=None, translate=None):
        if self._error is not None:
            return failing_future(self._error if translate is None else translate(self._error))
        return done_future(self.result if value is None else value)


class Queued(Pending):
    """A collective queued on its group's progress thread: ``inner`` is the future its job
    completes (with the result, or with ``set_exception`` for Python readers only)."""

    __slots__ = ("inner",)

    def __init__(self, inner: torch.futures.Future):
        self.inner = inner

    def wait(self):
        return self.inner.wait()

    def done(self) -> bool:
        return self.inner.done()

    def error(self):
        if not self.inner.done():
            return None
        try:
            self.inner.value()
        except BaseException as exc:
            return exc
        return None

    def future(self, value=None, translate=None):
        if self.inner.done():                   # no callback hop for what has ended
            error = self.error()
            if error is not None:
                return failing_future(error if translate is None else translate(error))
            return done_future(self.inner.value() if value is None else value)
        return torch_future(self.inner, value, translate)


class EnginePending(Pending):
    """A collective the engine (Gloo, NCCL) runs: its own ``Work``, waited for in the caller's
    thread (no callback hop on the engine's thread: on shared cores each costs a thread wake-up,
    about as long as a 4 KB collective). ``translate(error)`` names the failure as gradsync does;
    ``ended(error or None)`` is called once, by whoever first sees the end."""

    __slots__ = ("work", "result", "translate", "ended", "_error", "_over")

    def __init__(self, work, result, translate, ended=None):
        self.work, self.result, self.translate, self.ended = work, result, translate, ended
        self._error, self._over = None, False

    def settle(self, exc) -> None:
        """It has ended, with ``exc`` (already translated) or well: an engine that blocks (MPI)."""
        self._end(exc)

    def _end(self, exc) -> None:
        if not self._over:
            self._over = True
            self._error = exc
            if self.ended is not None:
                self.ended(exc)

    def wait(self):
        if not self._over:
            try:
                self.work.wait()
            except BaseException as exc:        # the engine's own error, said as gradsync says it
                self._end(self.translate(exc))
            else:
                self._end(None)
        if self._error is not None:
            raise self._error
        return self.result

    def done(self) -> bool:
        return self._over or self.work.is_completed()

    def error(self):
        if not self.done():
            return None
        try:
            self.wait()
        except BaseException as exc:
            return exc
        return None

    def future(self, value=None, translate=None):
        if self.done():
            error = self.error()
            if error is not None:
                return failing_future(error if translate is None else translate(error))
            return done_future(self.result if value is None else value)
        inner = self.work.get_future()

        def settle(f):
            try:
                f.value()
            except BaseException as exc:
                self._end(self.translate(exc))
                raise (self._error if translate is None else translate(self._error)) from None
            self._end(None)
            return self.result if value is None else value

        return inner.then(settle)
