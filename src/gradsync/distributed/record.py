"""A collective the engine runs (Gloo's, NCCL's own), as the rest of gradsync sees it: an entry
in the flight recorder (``runtime.flight``), so that its record of the last collectives shows
every collective of a gradsync group by what ran it ("engine:gloo/all_reduce" beside "ring" and
"ring/reduce_scatter"); and on CPU, a failure that names the rank that died, as a schedule's
does (Gloo's own message says only that a connection closed)."""

from __future__ import annotations

import time
import weakref
from functools import lru_cache, partial

import numpy as np
import torch

from ..core.schedule import TRANSFER_DTYPE, Schedule
from ..runtime.flight import RECORDER
from ..runtime.transport.base import group_key
from .work import EngineWork, RankFailure, error_of, in_torch_terms


class _Seen:
    """What the recorder reads of a collective, for one run by the engine."""

    def __init__(self, group, schedule: Schedule, tensor: torch.Tensor):
        self.transport = self
        self.rank, self.size, self.group_key = group.rank(), group.size(), group.key
        self.buffers, self.schedule = {self.rank: tensor}, schedule


@lru_cache(maxsize=256)
def _named(name: str, workers: int, elements: int) -> Schedule:
    return Schedule(algorithm=name, workers=workers, elements=elements, transfers=np.empty(0, TRANSFER_DTYPE))


def engine_call(group, kind: str, engine_name: str, tensor, work, outputs=None):
    """Record ``work`` (the engine's Work for a ``kind`` collective of ``tensor``) until it
    ends; return it, or on CPU a ``Work`` whose failure names the rank that died (completed
    with ``outputs``). Example: ``engine_call(group, "all_reduce", "gloo", t, work, [t])``."""
    if group.key is None:
        try:
            group.key = group_key(group)
        except (RuntimeError, ValueError):       # not registered in torch's world (yet): not recorded
            return work
    tensor = tensor if tensor is not None else torch.empty(0)
    entry = RECORDER.begin(_Seen(group, _named(f"engine:{engine_name}/{kind}", group.size(), tensor.numel()),
                                 tensor))

    def ended(exc=None):
        RECORDER.end(entry, exc) if exc is not None else RECORDER.end(entry)

    if tensor.device.type != "cpu":      # NCCL's wait orders streams: keep its own Work
        try:
            work.get_future().add_done_callback(lambda f: ended(error_of(f)))
        except RuntimeError:             # an engine Work without a future: recorded as started only
            pass
        return work
    # A callback on the engine's future may hold this Work until it has run on the engine's own
    # thread; a strong reference to the group there could make that thread free the group, and
    # with it the engine, whose destructor then joins the very thread it runs on (std::terminate).
    return EngineWork(work, outputs, partial(_failure_if_alive, weakref.ref(group), f"{engine_name}'s {kind}"),
                      ended=ended)


def _failure_if_alive(group_ref, what: str, exc: BaseException) -> BaseException:
    group = group_ref()
    return in_torch_terms(exc) if group is None else named_failure(group, what, exc)


def named_failure(group, what: str, exc: BaseException) -> BaseException:
    """The error of an engine collective that failed with ``exc``: a ``RankFailure`` naming the
    rank that is missing (the survivors check in at the group's store; who does not is named),
    or ``exc`` itself when it is not a failure of the group (a bad argument).

    Example, when Gloo's all_reduce failed with ``exc``: ``named_failure(group, "gloo's all_reduce", exc).peer``.
    """
    from ..runtime.transport.distributed import DistributedTransport, Pending

    if not isinstance(exc, RuntimeError) or isinstance(exc, (ValueError, TypeError)):
        return in_torch_terms(exc)
    try:
        transport = DistributedTransport(group)
        error = transport.failure_of(exc, Pending(None, -1, "collective", 0), time.monotonic() + 1.0)
    except Exception:                    # the store is gone too: Gloo's own words
        return exc
    if error.peer is None:
        return RankFailure(f"{error} (in {what}: {str(exc).splitlines()[0][:200]})", op=error.op)
    return RankFailure(f"rank {group.rank()}: rank {error.peer} failed: {error} (in {what}: "
                       f"{str(exc).splitlines()[0][:200]})", peer=error.peer, op=error.op)
