"""The MPI engine: gradsync's communicator over mpi4py (Open MPI: shared memory within a
machine, TCP or InfiniBand across machines), for clusters run by mpirun or Slurm.

A communicator per MPI communicator (``mpi_communicator``): its engine is MPI's own collectives
(``runtime.engines.MpiEngine``: ``Allreduce``, ``Reduce_scatter_block``, ``Allgather``,
``Bcast``), its schedules' messages travel over mpi4py's point-to-point (``transport/mpi.py``),
and ``auto`` weighs them against each other as it does on Gloo (``runtime.choice``). MPI waits
have no timeout, so a schedule's ``wait`` polls ``Test`` until the deadline; by default Open MPI
aborts the whole job when a process dies, so a dead peer ends the job rather than raising
PeerError.

Run a script with it: ``mpirun -np 4 python train.py`` where the script calls
``gradsync.integrations.mpi.all_reduce(tensor, algorithm="ring")`` (or "auto").
"""

from __future__ import annotations

import time

import torch

from .. import algorithms
from ..errors import ConfigError
from ..runtime import flight
from ..runtime.communicator import Communicator
from ..runtime.engines import MpiEngine
from ..runtime.prepare import build
from ..runtime.request import Request
from ..runtime.state import group_state
from ..runtime.transport.mpi import MpiTransport


class _Ranks:
    """What the communicator asks of its group: rank and size."""

    def __init__(self, comm):
        self.comm = comm

    def rank(self) -> int:
        return self.comm.Get_rank()

    def size(self) -> int:
        return self.comm.Get_size()


class MpiCommunicator(Communicator):
    """A communicator whose engine is MPI's own collectives and whose schedules travel over
    mpi4py's point-to-point. Open MPI has its own shared memory: no gradsync segment here.

    Example, under ``mpirun``: ``mpi_communicator().all_reduce(grad, "sum", "auto")``.
    """

    def __init__(self, comm, timeout: float):
        super().__init__(_Ranks(comm), MpiEngine(comm), timeout, "mpi", key=f"mpi/{comm.py2f()}")
        self.mpi = comm
        self._hosts = None

    def shared(self):
        return None

    def schedule_transport(self) -> str:
        return "mpi"

    def messages(self):
        return MpiTransport(self.mpi)

    def hosts(self):
        """Where the ranks run, from each rank's host identity gathered by MPI (fixed bytes)."""
        if self._hosts is None:
            from ..runtime.transport.hosts import IDENTITY_BYTES, from_identities, identity

            mine = torch.frombuffer(bytearray(identity()), dtype=torch.uint8)
            every = torch.empty((self.size, IDENTITY_BYTES), dtype=torch.uint8)
            self.mpi.Allgather(mine.numpy(), every.numpy())
            self._hosts = from_identities([bytes(row.tolist()) for row in every])
        return self._hosts


def mpi_communicator(comm=None, timeout: float = 60.0) -> MpiCommunicator:
    """The communicator of an MPI communicator (``MPI.COMM_WORLD`` by default), made on first
    use and kept in the group's state. Example: ``mpi_communicator().barrier()``."""
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return group_state(f"mpi/{comm.py2f()}").slot(f"communicator/{float(timeout)}",
                                                   lambda: MpiCommunicator(comm, timeout))


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", comm=None,
               timeout: float = 60.0, check: bool = True, check_finite: bool = False, trace=None,
               **options) -> torch.Tensor:
    """``gradsync.all_reduce`` over MPI: in place, any algorithm, or "auto" (MPI's own
    ``Allreduce`` among the candidates); CPU tensors; ``trace`` as there.

    Example, under ``mpirun -np 4 python script.py``::

        grad = torch.ones(1000)
        gradsync.integrations.mpi.all_reduce(grad, algorithm="ring")
    """
    request = Request.checked(tensor, algorithm, op, timeout, options=options, check=check,
                              check_finite=check_finite, trace=trace)
    if tensor.device.type != "cpu":
        raise ConfigError("the MPI engine takes CPU tensors")
    flight.watch_signal()
    if trace is None and not options and check and not check_finite and \
            (algorithm == "auto" or algorithms.get(algorithm).exact):
        return mpi_communicator(comm, request.timeout).all_reduce(tensor, op, algorithm)
    deadline = time.monotonic() + request.timeout
    # MPI has no progress thread of ours to hand over to: run it to the end here
    return build(request, MpiTransport(comm), deadline).start(inline=True).wait()
