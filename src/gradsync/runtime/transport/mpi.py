"""The MPI transport: mpi4py non-blocking point-to-point on tensors' bytes (no pickling).

MPI waits have no timeout, so ``wait`` polls ``Test`` until the deadline.
"""

from __future__ import annotations

import time

import torch

from ...errors import PeerError
from .base import post_each


def _comm(comm):
    from mpi4py import MPI

    return comm if comm is not None else MPI.COMM_WORLD


class MpiTransport:
    """mpi4py non-blocking point-to-point on tensors' bytes (no pickling)."""

    def __init__(self, comm=None):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, _comm(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.tag_ub = int(self.comm.Get_attr(MPI.TAG_UB) or 32767)
        self.group_key = f"mpi/{self.comm.py2f()}"

    def _buffer(self, tensor):
        return [tensor.view(torch.uint8).numpy() if tensor.numel() else bytearray(0), self.MPI.BYTE]

    def recv(self, tensor, peer, tag):
        return (self.comm.Irecv(self._buffer(tensor), source=peer, tag=tag % self.tag_ub), peer, "recv")

    def send(self, tensor, peer, tag):
        return (self.comm.Isend(self._buffer(tensor), dest=peer, tag=tag % self.tag_ub), peer, "send")

    def wait(self, pending, deadline):
        for request, peer, kind in pending:
            spins = 0
            while not request.Test():
                if time.monotonic() > deadline:
                    request.Cancel()
                    raise PeerError(f"rank {self.rank}: {'receive from' if kind == 'recv' else 'send to'} rank "
                                    f"{peer} did not answer before the timeout", peer=peer, op=kind)
                spins += 1
                if spins > 100:              # after a short spin, stop burning the core
                    time.sleep(20e-6)

    def post(self, ops):
        return post_each(self, ops)

    def close(self):
        pass

    def gather(self, data: torch.Tensor, deadline: float, tag: int = 0) -> list[torch.Tensor]:
        """Every rank's ``data`` (same-size bytes), by rank: an Allgather, without pickling
        (MPI orders collectives itself, so ``tag`` is not needed), not the messages of
        ``base.GatherOverPost``: one MPI call."""
        every = torch.empty((self.size, data.numel()), dtype=data.dtype)
        self.comm.Allgather(self._buffer(data), self._buffer(every))
        return list(every)
