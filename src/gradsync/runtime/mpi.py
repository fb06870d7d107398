"""The MPI engine: gradsync schedules over mpi4py point-to-point (Open MPI: shared memory within
a machine, TCP or InfiniBand across machines), for clusters run by mpirun or Slurm.

The executor is the same as on torch.distributed; only the transport differs. MPI waits have
no timeout, so ``wait`` polls ``Test`` until the deadline. By default Open MPI aborts the whole
job when a process dies, so a dead peer ends the job rather than raising PeerError.

Run a script with it: ``mpirun -np 4 python train.py`` where the script calls
``gradsync.runtime.mpi.all_reduce(tensor, algorithm="ring")``.
"""

from __future__ import annotations

import hashlib
import json
import time

import torch

from ..errors import ConfigError, MismatchError, PeerError
from .api import _frozen, _schedule
from .executor import execute


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


def _agree(transport: MpiTransport, description: dict) -> None:
    import numpy as np

    text = json.dumps(description, sort_keys=True)
    mine = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=16).digest(), dtype=np.uint8)
    every = np.empty((transport.size, 16), np.uint8)
    transport.comm.Allgather([mine, transport.MPI.BYTE], [every, transport.MPI.BYTE])
    if (every == every[0]).all():
        return
    raw = np.frombuffer(text.encode()[:512].ljust(512, b" "), dtype=np.uint8)
    texts = np.empty((transport.size, 512), np.uint8)
    transport.comm.Allgather([raw, transport.MPI.BYTE], [texts, transport.MPI.BYTE])
    seen = {r: bytes(t).decode(errors="replace").strip() for r, t in enumerate(texts)}
    raise MismatchError(f"rank {transport.rank}: ranks disagree on the collective, nothing was sent: "
                        + "; ".join(f"rank {r}: {t}" for r, t in seen.items()))


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", comm=None,
               timeout: float = 60.0, check: bool = True, **options) -> torch.Tensor:
    """``gradsync.all_reduce`` over MPI: in place, any exact algorithm or CERAR (CPU tensors).

    Example, under ``mpirun -np 4 python script.py``::

        grad = torch.ones(1000)
        gradsync.runtime.mpi.all_reduce(grad, algorithm="ring")
    """
    if tensor.device.type != "cpu":
        raise ConfigError("the MPI engine takes CPU tensors")
    if op not in ("sum", "avg"):
        raise ConfigError(f"op must be sum or avg, got {op!r}")
    transport = MpiTransport(comm)
    dtype = str(tensor.dtype).removeprefix("torch.")
    if check:
        _agree(transport, {"shape": list(tensor.shape), "dtype": dtype, "algorithm": algorithm, "op": op,
                           "options": json.loads(_frozen(options))})
    if transport.size == 1:
        return tensor
    schedule = _schedule(algorithm, transport.size, tensor.numel(), dtype, _frozen(options))
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    result = execute(schedule, flat, transport, time.monotonic() + timeout)
    if op == "avg":
        result.div_(transport.size)
    if result.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(result.view(tensor.shape))
    return tensor
