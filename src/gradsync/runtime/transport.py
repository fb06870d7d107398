"""Point-to-point transport: post receive, post send, wait with a deadline.

The executor talks only to this interface; ``TorchTransport`` implements it over
torch.distributed (Gloo on CPU, NCCL on GPU). Failures become ``PeerError`` naming the peer.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import PeerError


@dataclass
class Pending:
    """One posted operation: what to wait for and whom it involves."""

    work: object
    peer: int
    kind: str          # "recv" or "send"
    tag: int


class TorchTransport:
    """torch.distributed point-to-point operations within ``group``.

    >>> TorchTransport.__name__
    'TorchTransport'
    """

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.size)]

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return Pending(dist.irecv(tensor, self._global[peer], group=self.group, tag=tag), peer, "recv", tag)

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return Pending(dist.isend(tensor, self._global[peer], group=self.group, tag=tag), peer, "send", tag)

    def wait(self, pending: list[Pending], deadline: float) -> None:
        """Wait for every posted operation, all within ``deadline`` (time.monotonic())."""
        for p in pending:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("deadline passed")
                p.work.wait(datetime.timedelta(seconds=left))
            except (RuntimeError, TimeoutError, dist.DistBackendError) as exc:
                raise _peer_error(exc, p, self.rank) from None


def _peer_error(exc: Exception, p: Pending, rank: int) -> PeerError:
    text = str(exc)
    if "Timed out" in text or "deadline" in text or "timeout" in text.lower():
        why = "did not answer before the timeout"
    elif "closed by peer" in text or "Connection reset" in text or "Broken pipe" in text:
        why = "closed its connection (the process probably died)"
    else:
        why = f"failed: {text.splitlines()[0][:200] if text else type(exc).__name__}"
    direction = "receive from" if p.kind == "recv" else "send to"
    return PeerError(f"rank {rank}: {direction} rank {p.peer} {why}", peer=p.peer, op=p.kind)
