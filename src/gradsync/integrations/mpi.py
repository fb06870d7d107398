"""The MPI engine: gradsync schedules over mpi4py point-to-point (Open MPI: shared memory within
a machine, TCP or InfiniBand across machines), for clusters run by mpirun or Slurm.

The plan and the collective are the same as on torch.distributed; only the transport differs
(``transport/mpi.py``). MPI waits have no timeout, so ``wait`` polls ``Test`` until the deadline. By default Open MPI aborts the whole
job when a process dies, so a dead peer ends the job rather than raising PeerError.

Run a script with it: ``mpirun -np 4 python train.py`` where the script calls
``gradsync.integrations.mpi.all_reduce(tensor, algorithm="ring")``.
"""

from __future__ import annotations

import time

import torch

from ..errors import ConfigError
from ..runtime import flight
from ..runtime.prepare import build
from ..runtime.request import Request
from ..runtime.transport.mpi import MpiTransport


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", comm=None,
               timeout: float = 60.0, check: bool = True, check_finite: bool = False, trace=None,
               **options) -> torch.Tensor:
    """``gradsync.all_reduce`` over MPI: in place, any algorithm or "auto" (CPU tensors);
    ``trace`` as there.

    Example, under ``mpirun -np 4 python script.py``::

        grad = torch.ones(1000)
        gradsync.integrations.mpi.all_reduce(grad, algorithm="ring")
    """
    request = Request.checked(tensor, algorithm, op, timeout, options=options, check=check,
                              check_finite=check_finite, trace=trace)
    if tensor.device.type != "cpu":
        raise ConfigError("the MPI engine takes CPU tensors")
    flight.watch_signal()
    deadline = time.monotonic() + request.timeout
    # MPI has no progress thread of ours to hand over to: run it to the end here
    return build(request, MpiTransport(comm), deadline).start(inline=True).wait()
