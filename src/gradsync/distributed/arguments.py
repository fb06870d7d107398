"""What torch passes a process group, read: which tensors gradsync's paths take, the reduce op an
options object names, options built from torch's other call forms, and the list calls that are
one even collective.

Example: ``plain(torch.ones(4))`` is True; ``plain(torch.ones(4, 4).t())`` is False (not contiguous).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

# torch's ReduceOp by its hash (its enum value): an options object's ``reduceOp`` is a ReduceOp
# object that equals the RedOpType constants but does not find them as dict keys
REDUCE_OPS = {hash(getattr(dist.ReduceOp, name.upper())): name
              for name in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")}
AllreduceOptions, BroadcastOptions = dist.AllreduceOptions, dist.BroadcastOptions
ReduceScatterOptions, AllgatherOptions = dist.ReduceScatterOptions, dist.distributed_c10d.AllgatherOptions


def plain(t) -> bool:
    """A dense, contiguous, non-empty CPU tensor: what gradsync's paths take (anything else:
    the engine, which does with it what Gloo does)."""
    return type(t) is torch.Tensor and t.is_cpu and t.layout is torch.strided and t.numel() > 0 \
        and t.is_contiguous()


def first_tensor(args, kwargs):
    """The first tensor of a call's arguments (nested in lists), which decides its engine."""
    for value in list(args) + list(kwargs.values()):
        while isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value
    return None


def options_with(options, **fields):
    """An ``options`` object (torch's class) with the fields given that are not None set: what
    torch's other call forms (an op, a root, a timeout) mean as options."""
    opts = options()
    for key, value in fields.items():
        if value is not None:
            setattr(opts, key, value)
    return opts


# torch's method name -> the collective's name in gradsync's records
COLLECTIVE_OF = {"allreduce": "all_reduce", "_reduce_scatter_base": "reduce_scatter",
                 "reduce_scatter": "reduce_scatter", "_allgather_base": "all_gather", "allgather": "all_gather",
                 "alltoall_base": "alltoall", "allreduce_coalesced": "all_reduce_coalesced",
                 "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
                 "allgather_into_tensor_coalesced": "all_gather_coalesced"}


def even(one, many, size: int) -> bool:
    """One plain tensor beside ``size`` plain tensors of its shape and dtype (a list call gradsync takes)."""
    return len(many) == size and plain(one) and all(
        plain(x) and x.dtype == one.dtype and x.shape == one.shape and x.is_contiguous() for x in many) \
        and one.is_contiguous() and size > 1


def scatter_into(outs, flat) -> None:
    """Copy ``flat``'s equal parts into the tensors ``outs``, in order."""
    for o, part in zip(outs, flat.chunk(len(outs))):
        o.copy_(part.view(o.shape))


def subgroup_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """A subgroup made without a timeout (DeviceMesh's, torch's 30-minute default) takes the
    default group's, as a user who gave ``init_process_group`` one expects: else a stopped
    rank would be waited for 30 minutes in an HSDP shard group."""
    default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    mine = getattr(default, "timeout", None)
    if timeout == dist.default_pg_timeout and isinstance(mine, float) and mine < timeout.total_seconds():
        return datetime.timedelta(seconds=mine)
    return timeout


INLINE_MAX = 256 << 10      # a collective up to this size runs in the caller's thread (its hand-over costs more)


def queued(nbytes: int, opts) -> bool:
    """Whether a call goes to the group's progress thread: only a large one whose caller goes on
    (DDP's buckets, FSDP2's prefetches, ``async_op=True``). A blocking call (``dist.all_reduce``
    without async_op sets the options' asyncOp to False, then waits at once) runs in the
    caller's thread at every size: handing 1 to 4 MiB over to the thread and waiting for it
    took 1.6x the call's own time on 2 cores. ``queued(1 << 20, AllreduceOptions())`` is True."""
    return nbytes > INLINE_MAX and getattr(opts, "asyncOp", True)
