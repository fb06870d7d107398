"""The MPI engine: gradsync schedules over mpi4py point-to-point (Open MPI: shared memory within
a machine, TCP or InfiniBand across machines), for clusters run by mpirun or Slurm.

The executor is the same as on torch.distributed; only the transport differs. MPI waits have
no timeout, so ``wait`` polls ``Test`` until the deadline. By default Open MPI aborts the whole
job when a process dies, so a dead peer ends the job rather than raising PeerError.

Run a script with it: ``mpirun -np 4 python train.py`` where the script calls
``gradsync.runtime.mpi.all_reduce(tensor, algorithm="ring")``.
"""

from __future__ import annotations

import time

import torch

from ..errors import ConfigError, PeerError
from .api import check_call, run_all_reduce


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

    def gather(self, data: torch.Tensor, deadline: float, tag: int = 0) -> list[torch.Tensor]:
        """Every rank's ``data`` (same-size bytes), by rank: an Allgather, without pickling
        (MPI orders collectives itself, so ``tag`` is not needed)."""
        every = torch.empty((self.size, data.numel()), dtype=data.dtype)
        self.comm.Allgather(self._buffer(data), self._buffer(every))
        return list(every)


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", comm=None,
               timeout: float = 60.0, check: bool = True, check_finite: bool = False, **options) -> torch.Tensor:
    """``gradsync.all_reduce`` over MPI: in place, any algorithm or "auto" (CPU tensors).

    Example, under ``mpirun -np 4 python script.py``::

        grad = torch.ones(1000)
        gradsync.runtime.mpi.all_reduce(grad, algorithm="ring")
    """
    timeout = check_call(tensor, op, timeout)
    if tensor.device.type != "cpu":
        raise ConfigError("the MPI engine takes CPU tensors")
    return run_all_reduce(tensor, algorithm, op, MpiTransport(comm), time.monotonic() + timeout, check,
                          check_finite, options)
