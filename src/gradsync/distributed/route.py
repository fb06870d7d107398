"""The one place that decides how a collective of the gradsync backend runs.

``route(group, call)`` takes every collective ``GradsyncGroup`` receives and picks its runner:

- ``"engine"``: the underlying engine's own collective (Gloo on CPU, NCCL on CUDA): for CUDA
  tensors, for the ops a schedule cannot express (max, min, product, bitwise), for all_to_all,
  gather, scatter, reduce, coalesced all-reduce, and wherever the choice says "engine";
- ``"schedule"``: a gradsync schedule, the algorithm the group's choice names (``config``), or
  the one ``auto`` measured to be fastest at this size (which may be the engine's):
  all_reduce (sum, avg) as ``gradsync.all_reduce``, reduce_scatter and all_gather as an
  all-reduce schedule's REDUCE or COPY half, broadcast as the COPY half of tree or central
  (``runtime.halves``);
- ``"one_host"``: the shared-buffer collectives of ``runtime.one_host`` (every rank on this
  host), chosen as "one_host" or by ``auto`` where it measured fastest.

``RUNNERS`` maps a runner's name to its function: another one is one entry there.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from ..runtime import halves
from ..runtime.api import all_reduce as gradsync_all_reduce
from ..runtime.transport import for_group
from .config import trace as trace_of
from .record import engine_call
from .work import Work, done

SCHEDULED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
OPS = (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG))     # what a schedule's REDUCE can do
# the engine's method for each of torch's calls that a schedule could also run
ENGINE_METHODS = {"all_reduce": "allreduce", "reduce_scatter": "_reduce_scatter_base",
                  "all_gather": "_allgather_base", "reduce_scatter_list": "reduce_scatter",
                  "all_gather_list": "allgather", "broadcast": "broadcast", "barrier": "barrier"}


@dataclass
class Call:
    """One collective as torch passed it: ``kind`` (a key of ENGINE_METHODS, or "engine" with
    the engine's ``method``), its output and input tensors (lists, or lists of lists), torch's
    options object, the reduce ``op`` and broadcast ``root`` where they apply, and ``extra``
    arguments the engine's method takes after them (all_to_all's splits).

    >>> Call("barrier", [], [], None).base
    'barrier'
    """

    kind: str
    outputs: list
    inputs: list
    opts: object
    op: object = None
    root: int | None = None
    method: str | None = None
    extra: tuple = field(default_factory=tuple)

    @property
    def base(self) -> str:
        """The collective of config's KINDS this call is (list forms are their tensor form)."""
        return self.kind.removesuffix("_list")

    def tensor(self):
        """The call's first tensor (its device and size decide), or None (a barrier)."""
        for t in (self.inputs or self.outputs):
            return t[0] if isinstance(t, (list, tuple)) else t
        return None


def route(group, call: Call):
    """Run ``call`` on ``group`` the way its choice says; return torch's ``Work``.

    Example, in a ``GradsyncGroup`` method: ``return route(self, Call("barrier", [], [], opts))``.
    """
    if group.closed:
        raise dist.DistBackendError(f"the gradsync process group {group.group_name} was shut down or aborted")
    runner, algorithm = _runner(group, call)
    return RUNNERS[runner](group, call, algorithm)


def _runner(group, call: Call) -> tuple[str, str | None]:
    """(runner, algorithm) for ``call``: "engine" where a schedule cannot run it or the choice says so."""
    t = call.tensor()
    if call.kind == "engine" or call.base not in SCHEDULED or (t is not None and t.device.type != "cpu"):
        return "engine", None
    if call.op is not None and op_name(call.op) is None:
        return "engine", None
    choice = group.choices.get(call.base, "auto")
    if choice == "auto":
        from .auto import choose

        choice = choose(group, call.base, 0 if t is None else _nbytes(call), partial(trial, group))
    if choice in ("engine", "one_host"):
        return choice, None
    return "schedule", choice


def trial(group, choice: str, kind: str, nbytes: int) -> float:
    """Seconds one ``kind`` collective of ``nbytes`` (float32) takes on this rank as ``choice``
    ("engine", "one_host" or an algorithm): what ``auto`` measures. Every rank must call it alike.

    Example, in each rank: ``trial(group, "ring", "all_reduce", 1 << 20)`` is a few milliseconds.
    """
    workers = group.size()
    n = max(workers, nbytes // 4 // workers * workers)
    full, part = torch.ones(n), torch.ones(n // workers)
    outputs, inputs = {"all_reduce": ([full], [full]), "reduce_scatter": ([part], [full]),
                       "all_gather": ([full], [part])}[kind]
    call = Call(kind, outputs, inputs, None, op=dist.ReduceOp.SUM if kind != "all_gather" else None)
    if kind == "all_reduce":
        call.opts = dist.AllreduceOptions()
    elif kind == "reduce_scatter":
        call.opts = dist.ReduceScatterOptions()
    # the ranks start from the engine's barrier, as they arrive at a collective after their own
    # work: unevenly (a shared-buffer wait that spins past its first 50 us sleeps, and waking
    # costs; calls back to back in lockstep would never show it)
    group.engines["cpu"].barrier(dist.BarrierOptions()).wait()
    started = time.monotonic()
    RUNNERS.get(choice, run_schedule)(group, call, choice).wait()
    return time.monotonic() - started


def op_name(op) -> str | None:
    """"sum" or "avg" for torch's ReduceOp (an object or its enum value), else None.

    >>> op_name(dist.ReduceOp.AVG), op_name(dist.ReduceOp.MAX)
    ('avg', None)
    """
    return next((name for name, value in OPS if op == value), None)


def _nbytes(call: Call) -> int:
    """The size that decides: the full tensor of reduce_scatter/all_gather, else the tensor."""
    big = call.inputs if call.base == "reduce_scatter" else call.outputs
    first = big[0]
    if isinstance(first, (list, tuple)):
        return sum(x.numel() * x.element_size() for x in first)
    return first.numel() * first.element_size()


def run_engine(group, call: Call, algorithm=None):
    """The engine's own collective (the method torch would have called on Gloo or NCCL),
    recorded in the flight recorder as "engine:<name>/<kind>".

    Example, in each rank: ``run_engine(group, Call("all_reduce", [t], [t], opts, op=opts.reduceOp)).wait()``.
    """
    t = call.tensor()
    engine = group.engine(t.device if t is not None else torch.device("cpu"))
    work = _engine_work(engine, call)
    return engine_call(group, call.base if call.kind != "engine" else call.method, engine.name().lower(), t, work,
                       call.outputs)


def _engine_work(engine, call: Call):
    method = call.method or ENGINE_METHODS[call.kind]
    if call.kind == "barrier":
        return engine.barrier(call.opts if call.opts is not None else dist.BarrierOptions())
    args = (call.inputs,) if method in ("allreduce", "allreduce_coalesced", "broadcast", "reduce") else \
        (call.outputs, call.inputs)
    if method in ("_reduce_scatter_base", "_allgather_base") and len(call.outputs) == 1:
        args = (call.outputs[0], call.inputs[0])
    elif method in ("_reduce_scatter_base", "_allgather_base"):       # coalesced: one at a time, in order
        works = [getattr(engine, method)(o, i, _options(method, call.opts)) for o, i in zip(call.outputs, call.inputs)]
        return _joined([w.get_future() for w in works], call.outputs)
    elif method == "alltoall_base":
        args = (call.outputs[0], call.inputs[0])
    return getattr(engine, method)(*args, *call.extra, _options(method, call.opts))


def _options(method: str, opts):
    """torch's options object for the engine's ``method``: the caller's, or a default one."""
    if opts is not None:
        return opts
    from torch._C import _distributed_c10d as c10d

    name = {"allreduce": "AllreduceOptions", "allreduce_coalesced": "AllreduceCoalescedOptions",
            "_reduce_scatter_base": "ReduceScatterOptions", "reduce_scatter": "ReduceScatterOptions",
            "_allgather_base": "AllgatherOptions", "allgather": "AllgatherOptions",
            "broadcast": "BroadcastOptions", "alltoall": "AllToAllOptions", "alltoall_base": "AllToAllOptions",
            "gather": "GatherOptions", "scatter": "ScatterOptions", "reduce": "ReduceOptions"}[method]
    return getattr(c10d, name)()


def run_schedule(group, call: Call, algorithm: str):
    """The collective as a gradsync schedule of ``algorithm``.

    Example, in each rank: ``run_schedule(group, Call("all_gather", [out], [x], None), "ring").wait()``.
    """
    deadline = time.monotonic() + group.timeout
    op, over, traced = op_name(call.op) or "sum", group.schedule_transport(), trace_of()
    if call.kind == "all_reduce":
        futures = [gradsync_all_reduce(t, algorithm=algorithm, op=op, group=group, timeout=group.timeout,
                                       async_op=True, transport=over, trace=traced).get_future()
                   for t in call.inputs]
        return _joined(futures, call.outputs)
    futures = []
    for out, inp in zip(call.outputs, call.inputs):
        transport = for_group(over, group, "cpu", group.timeout)
        futures.append(_half(call, out, inp, algorithm, op, transport, deadline, traced))
    return _joined(futures, call.outputs)


def _half(call: Call, out, inp, algorithm: str, op: str, transport, deadline: float,
          traced=None) -> torch.futures.Future:
    """One tensor's reduce-scatter, all-gather or broadcast from a schedule's halves."""
    common = dict(trace=traced)
    try:
        if call.kind == "broadcast":
            return halves.broadcast(out, call.root, algorithm, transport, deadline, **common).start()
        if call.kind == "reduce_scatter_list":
            return halves.reduce_scatter(out, torch.cat([x.reshape(-1) for x in inp]), algorithm, transport,
                                         deadline, op, **common).start()
        if call.kind == "reduce_scatter":
            return halves.reduce_scatter(out, inp, algorithm, transport, deadline, op, **common).start()
        if call.kind == "all_gather":
            return halves.all_gather(out, inp, algorithm, transport, deadline, **common).start()
        flat = torch.empty(inp.numel() * len(out), dtype=inp.dtype)       # all_gather_list
        gathered = halves.all_gather(flat, inp, algorithm, transport, deadline, **common).start()
        return _then(gathered, lambda: [o.copy_(c.view(o.shape)) for o, c in zip(out, flat.chunk(len(out)))])
    except BaseException:
        transport.close()
        raise


def _then(future: torch.futures.Future, fn) -> torch.futures.Future:
    """A future completed after ``fn()`` runs on ``future``'s success; its error as it is."""
    after = torch.futures.Future()

    def finish(f):
        try:
            f.value()
            fn()
        except BaseException as exc:      # handed on, type and all
            after.set_exception(exc)
            return
        after.set_result(None)

    future.add_done_callback(finish)
    return after


def _joined(futures: list, result) -> Work:
    """One ``Work`` for several futures, done when all are (the first error, if any)."""
    if not futures:
        return done(result)
    if len(futures) == 1:
        return Work(futures[0], result)
    joined, left, errors, lock = torch.futures.Future(), [len(futures)], [], threading.Lock()

    def one(f):
        try:
            f.value()
        except BaseException as exc:
            errors.append(exc)
        with lock:                      # futures complete on different threads
            left[0] -= 1
            last = left[0] == 0
        if last:
            joined.set_exception(errors[0]) if errors else joined.set_result(None)

    for f in futures:
        f.add_done_callback(one)
    return Work(joined, result)


def run_one_host(group, call: Call, algorithm=None):
    """The collective on this host's shared buffers (``runtime.one_host``: every rank on one
    host, CPU tensors), on the group's progress engine like the schedules.

    Example, in each rank on one host: ``run_one_host(group, Call("barrier", [], [], None)).wait()``.
    """
    from ..runtime import one_host

    op, common = op_name(call.op) or "sum", dict(group=group, timeout=group.timeout, async_op=True)
    if call.kind == "barrier":
        return _joined([one_host.barrier(**common).get_future()], [])
    if call.kind == "all_reduce":
        return _joined([one_host.all_reduce(t, op, **common).get_future() for t in call.inputs], call.outputs)
    futures = []
    for out, inp in zip(call.outputs, call.inputs):
        if call.kind == "broadcast":
            futures.append(one_host.broadcast(out, call.root, **common).get_future())
        elif call.kind.startswith("reduce_scatter"):
            whole = torch.cat([x.reshape(-1) for x in inp]) if call.kind == "reduce_scatter_list" else inp
            futures.append(one_host.reduce_scatter(out, whole, op, **common).get_future())
        elif call.kind == "all_gather":
            futures.append(one_host.all_gather(out, inp, **common).get_future())
        else:                                                      # all_gather_list
            flat = torch.empty(inp.numel() * len(out), dtype=inp.dtype)
            gathered = one_host.all_gather(flat, inp, **common).get_future()
            futures.append(_then(gathered, lambda out=out, flat=flat: [
                o.copy_(c.view(o.shape)) for o, c in zip(out, flat.chunk(len(out)))]))
    return _joined(futures, call.outputs)


RUNNERS = {"engine": run_engine, "schedule": run_schedule, "one_host": run_one_host}
