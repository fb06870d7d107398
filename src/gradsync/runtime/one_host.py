"""Every collective of gradient synchronization on one host's shared buffers: all-reduce,
reduce-scatter, all-gather, broadcast and barrier, for code that asks for them by name.

What sharded data parallelism calls (FSDP2, ZeRO: D2L's "each device owns 1/N") is the two
halves of the two-shot all-reduce: reduce-scatter is ``sharded``'s REDUCE round alone (rank r
sums segment r of every rank's input: torch's rank order), all-gather its COPY round alone
(rank r's input is segment r). Broadcast is one round of copies from the root. Each is the
group's communicator's shared-buffer collective (``communicator.SharedPlan``, run in C by
``transport.shm.native``), in order with the group's other collectives, so a dead rank is named
here as everywhere on shared memory. A message larger than a slot runs in pieces.

``group_buffers(group)`` says whether a group can use them: every rank on this host, CPU
tensors; otherwise the caller uses another engine.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .api import Work
from .communicator import communicator_for

OPS = ("sum", "avg")


def group_buffers(group=None, timeout: float | None = None):
    """The group's ``SharedBuffers`` when every rank of ``group`` runs on this host, else None.

    Example, in each rank: ``group_buffers() is not None`` on one host.
    """
    return communicator_for(group, timeout, "shm" if _one_host(group, timeout) else "gloo").shared()


def _one_host(group, timeout) -> bool:
    from .request import default_timeout
    from .transport.hosts import host_map

    return host_map(group, default_timeout() if timeout is None else timeout).hosts == 1


def _comm(group, timeout):
    if not _one_host(group, timeout):
        raise ConfigError("one_host collectives need every rank of the group on this host, sharing memory")
    comm = communicator_for(group, timeout, "shm")
    if comm.shared() is None:
        raise ConfigError("one_host collectives need every rank of the group on this host, sharing memory")
    return comm


def _handed(out, async_op: bool):
    return Work(out) if async_op else out


def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, timeout: float | None = None,
               async_op: bool = False):
    """All-reduce ``tensor`` in place on this host's shared buffers (one-shot or two-shot, by size).

    Example, in each rank on one host: ``one_host.all_reduce(grad, op="avg")``.
    """
    _check("all_reduce", tensor, tensor, op, tensor.numel(), tensor.numel())
    return _handed(_comm(group, timeout).all_reduce(tensor, op, "one_host", async_op), async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str = "sum", group=None,
                   timeout: float | None = None, async_op: bool = False):
    """Rank r's ``output`` gets the sum (or average) of segment r of every rank's ``input``
    (``input`` holds N x ``output.numel()`` elements, rank order), as torch's
    ``reduce_scatter_tensor``. ``input`` is left as it was.

    Example, in each of 4 ranks: ``reduce_scatter(torch.empty(2), torch.arange(8.))`` gives
    rank 1 ``[4 * 2., 4 * 3.]``.
    """
    comm = _comm(group, timeout)
    _check("reduce_scatter", output, input, op, comm.size * output.numel(), input.numel())
    return _handed(comm.reduce_scatter(output, input, op, "one_host", async_op), async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, timeout: float | None = None,
               async_op: bool = False):
    """``output`` (N x ``input.numel()`` elements) gets every rank's ``input``, in rank order,
    as torch's ``all_gather_into_tensor``.

    Example, in each of 2 ranks: ``all_gather(torch.empty(2), torch.tensor([rank + 0.]))`` gives ``[0., 1.]``.
    """
    comm = _comm(group, timeout)
    _check("all_gather", input, output, "sum", comm.size * input.numel(), output.numel())
    return _handed(comm.all_gather(output, input, "one_host", async_op), async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, group=None, timeout: float | None = None,
              async_op: bool = False):
    """Every rank's ``tensor`` gets rank ``src``'s (its rank in ``group``), in place.

    Example, in each rank: ``broadcast(weights, src=0)``.
    """
    comm = _comm(group, timeout)
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < comm.size:
        raise ConfigError(f"src must be a rank of the group, 0..{comm.size - 1}, got {src!r}")
    _check("broadcast", tensor, tensor, "sum", tensor.numel(), tensor.numel())
    return _handed(comm.broadcast(tensor, src, "one_host", async_op), async_op)


def barrier(group=None, timeout: float | None = None, async_op: bool = False):
    """Wait until every rank of ``group`` on this host has called it (``PeerError`` if one died).

    Example, in each rank: ``barrier()``.
    """
    return _handed(_comm(group, timeout).barrier("one_host", async_op), async_op)


def _check(name: str, small: torch.Tensor, large: torch.Tensor, op: str, want: int, got: int) -> int:
    """Refuse what the collective cannot take; return the elements per rank."""
    for t in (small, large):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
            what = f"a {type(t).__name__}" if not isinstance(t, torch.Tensor) else \
                f"a {t.device.type} tensor of shape {tuple(t.shape)}, strides {t.stride()}"
            raise ConfigError(f"{name} takes contiguous CPU tensors, got {what}")
    if small.dtype != large.dtype:
        raise ConfigError(f"{name}: input and output dtypes differ ({small.dtype} and {large.dtype})")
    if op not in OPS:
        raise ConfigError(f"{name}: op must be one of {', '.join(OPS)}, got {op!r}")
    if want != got:
        raise ConfigError(f"{name}: the larger tensor must hold {want} elements (ranks x the smaller), got {got}")
    return small.numel()
