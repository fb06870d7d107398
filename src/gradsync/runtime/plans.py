"""The plans of a communicator (``communicator``): what a call signature runs, made at its first
call and kept, so that a repeated call goes straight to the work.

- ``EnginePlan``: the engine's own collective (Gloo's, NCCL's, MPI's), started here and waited
  for in the caller's thread;
- ``SharedPlan``: the shared-buffer collectives of one host (``transport.shm.buffers``, in C),
  all-reduce by the read program of one_shot or sharded;
- ``SchedulePlan``: a gradsync schedule's messages over the group's transport: all-reduce as
  the whole schedule (``prepare.build``), the others as its halves (``halves``).

Each plan's ``start(tensors, async_op)`` returns the result (blocking) or a ``pending.Pending``,
records the collective in the flight recorder, and makes a peer's failure the group's.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from .. import algorithms
from ..errors import ConfigError
from . import halves, reads
from .agree import digest
from .flight import RECORDER
from .pending import EnginePending
from .request import Request


def schedule_takes(kind: str, algorithm: str, dtype, op) -> bool:
    """Whether a schedule can run this call: its REDUCE adds (sum, avg) and its dtype is one the
    algorithm takes; otherwise the call goes to the engine, never to a refusal."""
    if kind in ("all_reduce", "reduce_scatter") and op not in ("sum", "avg"):
        return False
    if dtype is None:
        return True
    from .. import dtypes
    from ..errors import ConfigError as Refused

    if str(dtype).removeprefix("torch.") not in dtypes.names():       # bool, complex: the engine's
        return False

    try:
        algorithms.get(algorithm).check_dtype(str(dtype).removeprefix("torch."))
    except Refused:
        return False
    return not (op == "avg" and not dtype.is_floating_point)



class EnginePlan:
    """The engine's own collective: started here, waited for in the caller's thread."""

    def __init__(self, comm, kind: str, op):
        self.comm, self.kind, self.op = comm, kind, op
        self.method = getattr(comm.engine, kind)
        # what the engine's method takes after the tensors: the op, the broadcast's root
        self.extra = () if kind in ("all_gather", "barrier") else (op,)
        self.divide = kind in ("all_reduce", "reduce_scatter") and comm.engine.divide_after(op)
        self.label = f"engine:{comm.engine.name}/{kind}"

    def start(self, tensors: tuple, async_op: bool):
        comm = self.comm
        if comm.failure is not None:
            raise comm.failure
        first = tensors[0] if tensors else None
        entry = RECORDER.begin(comm.key, comm.rank, comm.size, self.label, 0 if first is None else first.numel(),
                               1 if first is None else first.element_size(), None if first is None else first.dtype)
        started = time.monotonic()
        work = self.method(*tensors, *self.extra)
        pending = EnginePending(work, first, lambda exc: self._failure(exc, started),
                                lambda exc: self._ended(entry, exc, first))
        if work is None:                    # MPI: it has ended
            pending.settle(None)
        return pending if async_op else pending.wait()

    def _ended(self, entry, exc, first):
        if exc is None and self.divide:
            first.div_(self.comm.size)
        RECORDER.end(entry, exc)

    def _failure(self, exc: BaseException, started: float) -> BaseException:
        from .transport.distributed import named_failure

        return self.comm.fail(named_failure(self.comm.group, self.label, exc, self.comm.timeout, started))


class SharedPlan:
    """A collective on the shared buffers of one host (C: ``transport.shm.native``). Its first
    call settles everything but the tensors' addresses and the deadline (the read program, the
    dtype's and op's codes, the digest), so that a repeated call is one call into C."""

    def __init__(self, comm, kind: str, op, algorithm: str | None):
        self.comm, self.kind, self.op, self.algorithm = comm, kind, op, algorithm
        self.buffers = comm.shared()
        self._call = None                    # (tensors, deadline_ns) -> C's status, at the first call
        self._timeout_ns = int(comm.timeout * 1e9)
        self.label = "one_host" if kind == "all_reduce" and algorithm is None else \
            (algorithm or "one_host") + ("" if kind == "all_reduce" else f"/{kind}")

    def start(self, tensors: tuple, async_op: bool):
        comm = self.comm
        if comm.failure is not None:
            raise comm.failure
        return comm.run(self.job, tensors, async_op)

    def job(self, *tensors):
        comm = self.comm
        call = self._call or self._settle(tensors)
        first = tensors[0] if tensors else None
        entry = RECORDER.begin(comm.key, comm.rank, comm.size, self.label, 0 if first is None else first.numel(),
                               1 if first is None else first.element_size(), None if first is None else first.dtype,
                               1, self.buffers.group)
        deadline_ns = time.monotonic_ns() + self._timeout_ns
        try:
            status = call(tensors, deadline_ns)
            if status is not None:
                self.buffers.check(status, deadline_ns * 1e-9)
        except BaseException as exc:
            RECORDER.end(entry, exc)
            raise comm.fail(exc) from None
        RECORDER.end(entry)
        return first

    def _settle(self, tensors):
        """The call into C for this signature, everything but addresses and deadline fixed."""
        from .transport.shm.buffers import DTYPES, OPS, digest_words

        buffers, kind, native = self.buffers, self.kind, self.buffers.native
        if kind == "barrier":
            self._call = lambda ts, deadline: native.barrier(deadline)
            return self._call
        first = tensors[0]
        dtype, count = DTYPES[first.dtype], first.numel()
        op = OPS.index(self.op) if kind in ("all_reduce", "reduce_scatter") else 0
        if kind == "all_reduce":
            workers, rank = self.comm.size, buffers.rank
            algorithm = self.algorithm or reads.choose(count * first.element_size(), workers)
            d0, d1 = digest_words(_signature(kind, first, self.op, algorithm))
            if count * first.element_size() <= buffers.capacity:          # one piece: one call
                program = reads.packed(algorithm, workers, count, rank)
                self._call = lambda ts, deadline: native.run_reads(ts[0].data_ptr(), count, dtype, op, deadline,
                                                                   d0, d1, True, program)
            else:
                self._call = lambda ts, deadline: buffers.run_pieces(
                    ts[0], dtype, op, lambda m: reads.packed(algorithm, workers, m, rank), deadline, d0, d1)
        elif kind == "reduce_scatter":
            d0, d1 = digest_words(_signature(kind, first, self.op))
            self._call = lambda ts, deadline: native.reduce_scatter(ts[0].data_ptr(), ts[1].data_ptr(), count, dtype,
                                                                    op, deadline, d0, d1)
        elif kind == "all_gather":
            count = tensors[1].numel()
            d0, d1 = digest_words(_signature(kind, tensors[1]))
            self._call = lambda ts, deadline: native.all_gather(ts[0].data_ptr(), ts[1].data_ptr(), count, dtype,
                                                                deadline, d0, d1)
        else:
            root = self.op
            d0, d1 = digest_words(_signature(kind, first, root))
            self._call = lambda ts, deadline: native.broadcast(ts[0].data_ptr(), count, dtype, root, deadline, d0, d1)
        return self._call


def _signature(kind: str, tensor: torch.Tensor, *more) -> bytes:
    return _digests(kind, tensor.dtype, tensor.numel(), more)


_DIGESTS: OrderedDict = OrderedDict()


def _digests(kind, dtype, numel, more) -> bytes:
    """The digest of a collective's description, cached (a training loop repeats a few)."""
    key = (kind, dtype, numel, more)
    found = _DIGESTS.get(key)
    if found is None:
        found = _DIGESTS[key] = digest({"collective": kind, "dtype": str(dtype), "elements": numel,
                                        "more": [str(m) for m in more]})
        if len(_DIGESTS) > 1024:
            _DIGESTS.popitem(last=False)
    return found


class SchedulePlan:
    """A gradsync schedule's messages over the group's transport: all-reduce as the whole
    schedule, the other collectives as its halves (``halves``)."""

    def __init__(self, comm, kind: str, algorithm: str, op):
        if kind == "barrier":
            raise ConfigError(f"barrier runs on the engine or the shared buffers, not as {algorithm!r}")
        spec = algorithms.get(algorithm)
        if not spec.exact:
            raise ConfigError(f"{kind} of the backend takes exact algorithms, not {algorithm!r}")
        self.comm, self.kind, self.algorithm, self.op = comm, kind, algorithm, op

    def start(self, tensors: tuple, async_op: bool):
        comm = self.comm
        if comm.failure is not None:
            raise comm.failure
        collective = self._collective(tensors)
        return comm.run(lambda *t: self._job(collective), (), async_op)

    def _job(self, collective):
        try:
            return collective.start(inline=True).wait()
        except BaseException as exc:
            raise self.comm.fail(exc) from None

    def _collective(self, tensors):
        comm, kind = self.comm, self.kind
        deadline = time.monotonic() + comm.timeout
        transport = comm.messages()
        try:
            trace = comm.trace
            if kind == "all_reduce":
                from .prepare import build

                request = Request.checked(tensors[0], self.algorithm, self.op, comm.timeout, transport=None,
                                          trace=trace)
                return build(request, transport, deadline)
            if kind == "reduce_scatter":
                return halves.reduce_scatter(tensors[0], tensors[1], self.algorithm, transport, deadline, self.op,
                                             trace=trace)
            if kind == "all_gather":
                return halves.all_gather(tensors[0], tensors[1], self.algorithm, transport, deadline, trace=trace)
            return halves.broadcast(tensors[0], self.op, self.algorithm, transport, deadline, trace=trace)
        except BaseException:
            transport.close()
            raise
