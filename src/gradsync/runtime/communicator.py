"""One communicator per process group: the only owner of what a group has, and the one path
every collective of it takes.

A ``Communicator`` holds a group's engine (its own collectives: Gloo's, NCCL's, MPI's), the
schedules' transport, the host map, the shared-memory segment, the choice (``choice``), the
plans of the calls it has seen and its progress thread. ``gradsync.all_reduce``, the backend's
process group, the DDP hook, ``one_host`` and ``gradsync train`` call its typed methods
(``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``, ``barrier``); nothing in it
calls back up to them.

The hot path: a call's *signature* (collective, algorithm asked for, dtype, size, op, layout)
names a plan made at its first call (the choice made, the read program compiled, the engine's
method bound) and kept (at most ``PLANS`` per group). A repeated call looks it up and runs it:
no environment read, no option parsing, no string dispatch. Plans are of three kinds:

- ``EnginePlan``: the engine's own collective, waited for in the caller's thread;
- ``SharedPlan``: the shared-buffer collectives of one host (``transport.shm.buffers``, in C);
- ``SchedulePlan``: a gradsync schedule's messages over the group's transport (the executor
  of ``collective.Collective``, ``halves`` for reduce-scatter, all-gather and broadcast).

Every collective of a group runs in start order: a blocking call runs in the caller's thread
when nothing is queued, anything else on the group's progress thread (``progress``). Every one
leaves an entry in the flight recorder. A failure is the group's from then on: every later
call raises it at once, as torch's backends do after an error.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import torch

from ..errors import ConfigError, MismatchError, PeerError
from . import choice
from .engines import TorchEngine, op_name
from .pending import Done, Queued
from .plans import EnginePlan, SchedulePlan, SharedPlan, schedule_takes
from .progress import SLOT as PROGRESS, Progress
from .request import default_timeout
from .state import group_state
from .transport.base import group_key

PLANS = 256                    # signatures kept per group (least recently used dropped)
TEXT_BYTES = 96                # a call's description, as the ranks compare it before its first engine call
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
SLOT = "communicator"          # where a torch group's communicator is kept in its state


class Communicator:
    """Everything one process group has, and its collectives.

    Args:
        group: the torch.distributed process group the schedules' messages travel on (the
            gradsync backend's own group, or a Gloo or NCCL group).
        engine: the group's own collectives (``engines.TorchEngine`` or ``MpiEngine``).
        timeout: seconds within which a dead or stalled peer fails a collective.
        transport: "auto", "gloo" or "shm": what gradsync's schedules travel over.

    Example, in each rank: ``communicator_for(group).all_reduce(grad, "avg")``.
    """

    def __init__(self, group, engine, timeout: float | None = None, transport: str = "auto", key: str | None = None):
        self.group, self.engine = group, engine
        self.rank, self.size = group.rank(), group.size()
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self.transport = transport
        self.key = group_key(group) if key is None else key
        self.progress = group_state(self.key).slot(PROGRESS, Progress)   # the group's one progress thread
        self.verdicts: dict = {}            # (collective, dtype) -> choice.Verdicts, measured at first use
        self._plans: OrderedDict = OrderedDict()
        self._shared = None                 # the host's SharedGroup, or why there is none
        self._over = None                   # what the schedules travel over, once settled
        self._hosts = None                  # the host map, once exchanged
        self.trace = None                   # a tracing.Trace the schedules record into (every rank alike), or None
        self.failure: BaseException | None = None
        self.closed = False

    # --- what the group has ---------------------------------------------------------------

    def shared(self):
        """The group's shared buffers (every rank on this host, one segment mapped by all), or
        None. Set up once, by every rank together, at the first call that needs it."""
        if self.transport == "gloo":          # asked to keep to the engine's messages
            return None
        if self._shared is None:
            from .transport import shared_group

            self.hosts()                      # first through the engine: a dead peer fails it at once
            self._shared = shared_group(self.group, self.timeout)
        if isinstance(self._shared, str):
            return None
        from .transport.shm.buffers import SharedBuffers

        return SharedBuffers.of(self._shared)

    def hosts(self):
        """Where the group's ranks run (``transport.hosts.HostMap``: hosts, and each rank's
        process), exchanged once per group through the engine (a dead peer fails it at once, where
        the store would wait the whole timeout), kept in the group's state for the transports."""
        if self._hosts is None:
            from .transport.hosts import RECORD_BYTES, from_identities, host_map, record

            state = group_state(self.key)
            found = state.kept("host map", self.group)
            if found is None and isinstance(self.engine, TorchEngine):
                mine = torch.frombuffer(bytearray(record()), dtype=torch.uint8)
                every = torch.empty(self.size * RECORD_BYTES, dtype=torch.uint8)
                self.engine_wait(self.engine.all_gather(every, mine), "the host exchange")
                found = from_identities([bytes(row.tolist()) for row in every.view(self.size, RECORD_BYTES)])
                state.keep("host map", self.group, found)
            self._hosts = found or host_map(self.group, self.timeout)
        return self._hosts

    def engine_wait(self, work, what: str) -> None:
        """Wait for an engine collective of gradsync's own (set-up, measuring); its failure as
        the group's, naming the rank that failed."""
        if work is None:
            return
        started = time.monotonic()          # the work was posted just now
        try:
            work.wait()
        except Exception as exc:
            from .transport.distributed import named_failure

            raise self.fail(named_failure(self.group, what, exc, self.timeout, started)) from None

    def schedule_transport(self) -> str:
        """What the schedules' messages travel over: "shm" (one host), "mixed" (shared memory
        inside each host, Gloo across) or "gloo"; settled once per group, alike on every rank."""
        if self._over is None:
            from .transport import auto_kind

            over = self.transport
            if over == "auto":
                over = auto_kind(self.hosts())
                if over == "shm" and self.shared() is None:
                    over = "gloo"
            self._over = over
        return self._over

    def messages(self):
        """A transport for one schedule's messages (``transport.for_group``: the same choice)."""
        from .transport import for_group

        return for_group(self.transport, self.group, "cpu", self.timeout)

    # --- the collectives ------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algorithm: str = "auto", async_op: bool = False):
        """All-reduce ``tensor`` in place: the result (``async_op``: a ``Pending``).

        Example, in each rank: ``communicator_for().all_reduce(torch.ones(4), "sum")`` is 4 x N.
        """
        if self.size == 1 and algorithm == "auto":
            return _trivial(tensor.div_(1) if op == "avg" else tensor, async_op)
        key = ("all_reduce", algorithm, tensor.dtype, tensor.numel(), op, tensor.is_contiguous())
        plan = self._plans.get(key) or self._new(key, (tensor,))
        return plan.start((tensor,), async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str = "sum", algorithm: str = "auto",
                       async_op: bool = False):
        """Rank r's ``out`` gets ``op`` over every rank of chunk r of ``inp`` (torch's order)."""
        key = ("reduce_scatter", algorithm, out.dtype, out.numel(), op, out.is_contiguous() and inp.is_contiguous())
        plan = self._plans.get(key) or self._new(key, (out, inp))
        return plan.start((out, inp), async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, algorithm: str = "auto", async_op: bool = False):
        """``out`` gets every rank's ``inp``, in rank order."""
        key = ("all_gather", algorithm, inp.dtype, inp.numel(), None, out.is_contiguous() and inp.is_contiguous())
        plan = self._plans.get(key) or self._new(key, (out, inp))
        return plan.start((out, inp), async_op)

    def broadcast(self, tensor: torch.Tensor, root: int, algorithm: str = "auto", async_op: bool = False):
        """Every rank's ``tensor`` gets rank ``root``'s."""
        key = ("broadcast", algorithm, tensor.dtype, tensor.numel(), root, tensor.is_contiguous())
        plan = self._plans.get(key) or self._new(key, (tensor,))
        return plan.start((tensor,), async_op)

    def barrier(self, algorithm: str = "auto", async_op: bool = False):
        """Wait until every rank has called it."""
        key = ("barrier", algorithm, None, 0, None, True)
        plan = self._plans.get(key) or self._new(key, ())
        return plan.start((), async_op)

    # --- plans ------------------------------------------------------------------------------

    def _new(self, key: tuple, tensors: tuple):
        """The plan of a signature seen for the first time: the choice made, and kept."""
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise PeerError(f"rank {self.rank}: the group {self.key} was shut down or aborted", op="closed")
        kind, algorithm, dtype, numel, op, contiguous = key
        nbytes = numel * (dtype.itemsize if dtype is not None else 1) * (self.size if kind == "all_gather" else 1)
        try:
            if algorithm == "auto":
                algorithm = choice.choose(self, kind, dtype, nbytes)
            if algorithm == "engine" and not self.engine.takes(kind, dtype, op):   # MPI has no 16-bit floats
                algorithm = "ring" if kind != "barrier" else "engine"
            plan = self._build(kind, algorithm, dtype, op, contiguous)
            if isinstance(plan, EnginePlan) and kind != "barrier" and self.size > 1:
                self._agree(kind, tensors[-1], op)
        except (ConfigError, PeerError, MismatchError):
            raise
        except RuntimeError as exc:          # an engine call of the choice's measuring failed
            from .transport.distributed import named_failure

            raise self.fail(named_failure(self.group, f"choosing how to run {kind}", exc, self.timeout)) from None
        self._plans[key] = plan
        if len(self._plans) > PLANS:
            self._plans.popitem(last=False)
        return plan

    def _agree(self, kind: str, tensor: torch.Tensor, op) -> None:
        """Before a signature's first call on the engine: every rank makes the same call, or
        every rank raises ``MismatchError`` saying who makes which (Gloo itself would sum
        tensors of different lengths into a silently wrong result, or abort on dtypes). Later
        calls of the signature rely on it, as a schedule's agreement does after its first."""
        what = f"op {op}" if kind != "broadcast" else f"root {op}"
        text = (f"{kind}, shape {list(tensor.shape)}, dtype {str(tensor.dtype).removeprefix('torch.')}, "
                f"{what}").encode()[:TEXT_BYTES]
        mine = torch.frombuffer(bytearray(text.ljust(TEXT_BYTES, b" ")), dtype=torch.uint8)
        every = torch.empty(self.size * TEXT_BYTES, dtype=torch.uint8)
        self.engine_wait(self.engine.all_gather(every, mine), f"agreeing on {kind}")
        said = [bytes(row.tolist()).decode(errors="replace").strip() for row in every.view(self.size, TEXT_BYTES)]
        if any(x != said[self.rank] for x in said):
            raise MismatchError(f"rank {self.rank}: the ranks make different calls, nothing was run: "
                                + "; ".join(f"rank {r}: {x}" for r, x in enumerate(said)))

    def _build(self, kind: str, algorithm: str, dtype, op, contiguous: bool):
        if algorithm == "engine":
            return EnginePlan(self, kind, op)
        if algorithm in ("one_host", "one_shot", "sharded") and self._shared_fits(kind, dtype, op, contiguous, algorithm):
            return SharedPlan(self, kind, op, None if algorithm == "one_host" else algorithm)
        # what the shared buffers or a schedule cannot run (an op they do not reduce, bool, a
        # group across hosts for one_host) goes to the engine, never to a refusal
        if algorithm == "one_host" or not schedule_takes(kind, algorithm, dtype, op):
            return EnginePlan(self, kind, op)
        return SchedulePlan(self, kind, algorithm, op)

    def _shared_fits(self, kind, dtype, op, contiguous, algorithm) -> bool:
        from .transport.shm.buffers import DTYPES, reduces

        if not contiguous or (kind != "barrier" and dtype not in DTYPES):
            return False
        if kind in ("all_reduce", "reduce_scatter") and not reduces(dtype, op):
            return False
        if algorithm != "one_host" and self.schedule_transport() != "shm":
            return False
        return self.shared() is not None

    def run(self, job, tensors: tuple, async_op: bool):
        """Run ``job(*tensors)`` (one collective's whole life) in start order with the group's
        others: in this thread when blocking and nothing is queued, else on the progress thread."""
        engine = self.progress
        if not async_op and (not engine.queued or engine.thread is threading.current_thread()):
            with engine.running:
                return job(*tensors)
        future = torch.futures.Future()
        engine.submit(_Call(job, tensors), future)
        return Queued(future) if async_op else future.wait()

    def fail(self, error: BaseException) -> BaseException:
        """Remember the group's failure (a peer's): every later call raises it at once."""
        if isinstance(error, PeerError) and self.failure is None:
            self.failure = error
        return error

    def abandon(self, reason: str) -> None:
        """Give the group up at once (``abort``): a collective waiting on the shared buffers or
        channels fails within their check interval, and every later call raises."""
        self.closed = True
        if self.failure is None:
            self.failure = PeerError(f"rank {self.rank}: {reason}", op="aborted")
        if self._shared is not None and not isinstance(self._shared, str):
            self._shared.cancel(self.failure)

    def close(self) -> None:
        """Stop the group's progress thread (after what is queued), drop the plans, and release
        the segment (unmapped once nothing of the group runs)."""
        if self.closed:
            return
        self.closed = True
        self.progress.close()
        self._plans.clear()
        if self._shared is not None and not isinstance(self._shared, str):
            with self.progress.running:
                self._shared.close()

    def busy(self) -> bool:
        """Whether a collective is queued or running (the group state keeps a busy group)."""
        return self.progress.busy()


def _trivial(tensor, async_op: bool):
    return Done(tensor) if async_op else tensor


class _Call:
    """A job for the progress thread: ``complete(future)`` runs it, in the inference mode its
    caller was in (a thread-local mode: without it, writing into a caller's inference tensor
    from the progress thread is refused)."""

    __slots__ = ("job", "tensors", "inference")

    def __init__(self, job, tensors):
        self.job, self.tensors = job, tensors
        self.inference = torch.is_inference_mode_enabled()

    def complete(self, future: torch.futures.Future) -> None:
        try:
            with torch.inference_mode(self.inference):
                result = self.job(*self.tensors)
        except BaseException as exc:        # carried to whoever waits (``pending`` fails it for C++)
            future.set_exception(exc)
            return
        future.set_result(result)


# --- finding a group's communicator ---------------------------------------------------------

def communicator_for(group=None, timeout: float | None = None, transport: str = "auto") -> Communicator:
    """The communicator of a torch.distributed ``group`` (the default group if None): the
    gradsync backend's own, else one made on first use and kept for that group object.

    Example, in each rank after ``dist.init_process_group("gloo", ...)``:
    ``communicator_for().all_reduce(torch.ones(4))``.
    """
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    own = getattr(pg, "communicator", None)
    if own is not None:
        return own() if callable(own) else own
    state = group_state(group_key(group))
    slot = f"{SLOT}/{transport}/{timeout}"
    comm = state.kept(slot, pg)
    if comm is None:
        comm = Communicator(pg, TorchEngine(pg), timeout, transport)
        state.keep(slot, pg, comm)
    return comm


__all__ = ["Communicator", "EnginePlan", "KINDS", "SchedulePlan", "SharedPlan", "communicator_for", "op_name"]
