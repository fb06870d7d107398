"""A collective in flight: a compiled plan, its buffers and scratch, and a transport.

``Collective.start()`` returns a ``torch.futures.Future`` completed with the result tensor (or
the ``PeerError``/``MismatchError`` that ended it); it runs on the group's progress engine
(``progress.py``). The plan (``gradsync.core.plan``) says what to post and when: exact schedules
run through ``exact.ExactRun``, coded ones (CERAR) through ``coded.CodedRun``. What the result
needs at the end (an average, an approximation's finiteness check, a copy back into a
non-contiguous tensor) is the collective's own ``Finish``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.plan import HOST_RANK, Plan
from ..core.schedule import Schedule
from ..errors import NonFiniteError
from .agree import Agreement
from .coded import CodedRun
from .exact import ExactRun
from .flight import RECORDER
from .progress import start
from .scratch import SCRATCH
from .tracing import NO_RECORD


@dataclass(frozen=True, eq=False)
class Finish:
    """What an all-reduce does with its result before handing it over.

    tensor: the caller's tensor; the result is copied into it unless it is the same memory.
    op: "sum", or "avg" to divide by ``workers``.
    finite_result: an approximate algorithm ran on a finite tensor: its result must be finite
        too, else ``NonFiniteError`` (``label`` names the algorithm and options there).

    >>> Finish(torch.ones(2), "avg", 4).apply(torch.ones(2), rank=0).tolist()
    [0.25, 0.25]
    """

    tensor: torch.Tensor
    op: str = "sum"
    workers: int = 1
    finite_result: bool = False
    label: str = ""

    def apply(self, result: torch.Tensor, rank: int) -> torch.Tensor:
        if self.finite_result and not bool(torch.isfinite(result).all()):
            raise NonFiniteError(f"rank {rank}: {self.label} turned a finite tensor into NaN or Inf: its design is "
                                 f"not accurate enough for these values; use fewer components or an exact algorithm")
        if self.op == "avg":
            result.div_(self.workers)
        tensor = self.tensor
        if result.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            tensor.copy_(result.view(tensor.shape))
        return tensor


class Collective:
    """One all-reduce (or part of one: the KVStore's push or pull) ready to run.

    Args:
        schedule, plan: what to run, and this rank's compiled part of it.
        buffers: node -> flat tensor of the nodes this rank runs (its worker's, and the
            helpers' on HOST_RANK); exact schedules work on them in place.
        transport: the group's transport for this collective.
        deadline: time.monotonic() by which it must be done.
        agreement: an ``Agreement`` whose digests ride along with the first messages, checked
            before anything received is applied; None when it was checked beforehand.
        finish: a ``Finish`` applied to the result on success; None hands the result over as is.
        salt: mixed into the tags so that ranks running different collectives cannot match
            each other's messages.
        design: the codec's design, for coded schedules (CERAR).
        trace: a ``tracing.Trace`` recording this collective's events, or None (no cost).
    """

    def __init__(self, schedule: Schedule, plan: Plan, buffers: dict, transport, deadline: float,
                 agreement: Agreement | None = None, finish: Finish | None = None, salt: int = 0, design=None,
                 trace=None):
        self.schedule, self.plan, self.buffers, self.design = schedule, plan, buffers, design
        self.trace = trace
        self.flight = None            # this collective's flight recorder entry, once it runs
        self.transport, self.deadline, self.agreement, self.finish = transport, deadline, agreement, finish
        bits = max(0, min(8, 30 - plan.tag_bits))
        self._salt = (salt & ((1 << bits) - 1)) << plan.tag_bits

    def start(self, inline: bool = False) -> torch.futures.Future:
        """Run it; return a future of the result. ``inline``: in this thread, if nothing is queued.

        Example, in each rank of a group: ``tensor = collective.start().wait()``.
        """
        return start(self, self.transport, inline)

    def complete(self, future: torch.futures.Future) -> None:
        try:
            with torch.no_grad():          # a parameter may be all-reduced in place, as with dist
                result = self.run()
            if self.finish is not None:
                result = self.finish.apply(result, self.transport.rank)
        except BaseException as exc:       # the future carries it to whoever waits
            if self.flight is not None:
                RECORDER.end(self.flight, exc)     # writes the flight record on PeerError, MismatchError
            self.transport.close()
            future.set_exception(exc)
            return
        RECORDER.end(self.flight)
        self.transport.close()
        future.set_result(result)

    def run(self) -> torch.Tensor:
        """Run the plan to the end in this thread; return the result tensor."""
        transport, flat = self.transport, self.buffers.get(self.transport.rank)
        self.flight = RECORDER.begin(getattr(transport, "group_key", "default"), transport.rank, transport.size,
                                     self.schedule.algorithm, self.schedule.elements, flat.element_size(), flat.dtype,
                                     self.schedule.rounds, transport)
        if self.agreement is not None:
            self.agreement.post()
            if self.agreement.before_data:
                self.flight.phase = "agree"
                self._verify_agreement()
                self.flight.phase = "run"
        rank, flat = self.transport.rank, self.buffers.get(self.transport.rank)
        rec = NO_RECORD if self.trace is None else self.trace.begin(rank, self.describe())
        common = dict(transport=self.transport, deadline=self.deadline, salt=self._salt,
                      verify=self._verify_agreement, rec=rec, flight=self.flight)
        if self.schedule.codec is not None:
            result = CodedRun(self.plan, self.design, flat, **common).run() if flat.numel() else flat
        else:
            scratch = SCRATCH.take(flat.dtype, flat.device, self.plan.scratch) if self.plan.scratch else None
            try:
                ExactRun(self.plan, self.buffers, scratch, **common).run()
            finally:
                if scratch is not None:
                    SCRATCH.give(scratch)
            result = flat
        rec.end(self.transport, self.deadline)
        return result

    def describe(self) -> dict:
        """What this collective is, for traces and the flight recorder."""
        flat = self.buffers.get(self.transport.rank)
        return {"algorithm": self.schedule.algorithm, "bytes": self.schedule.elements * flat.element_size(),
                "dtype": str(flat.dtype).removeprefix("torch."), "workers": self.schedule.workers,
                "rounds": self.schedule.rounds}

    def _verify_agreement(self) -> None:
        """Before the first received piece is used: every rank runs this same collective."""
        if self.agreement is not None:
            self.agreement.verify(self.deadline)
            self.agreement = None


class Done:
    """A one-rank group's all-reduce: nothing to move."""

    def __init__(self, tensor, transport):
        self.tensor, self.transport = tensor, transport

    def start(self, inline: bool = False) -> torch.futures.Future:
        self.transport.close()
        future = torch.futures.Future()
        future.set_result(self.tensor)
        return future


def node_buffers(schedule: Schedule, rank: int, flat: torch.Tensor) -> dict[int, torch.Tensor]:
    """The buffers of the nodes this rank runs: its worker's, plus the helpers' on HOST_RANK.

    >>> from gradsync.algorithms import host
    >>> sorted(node_buffers(host.schedule(2, 4), 0, torch.ones(4)))
    [0, 2]
    """
    buffers = {rank: flat}
    if rank == HOST_RANK:
        for h in range(len(schedule.helpers)):
            buffers[schedule.workers + h] = torch.zeros_like(flat)
    return buffers
