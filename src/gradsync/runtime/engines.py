"""The engines: a group's own collectives (Gloo's or NCCL's through torch.distributed, Open
MPI's through mpi4py), called the same way by the communicator, which weighs them against
gradsync's schedules and shared buffers and runs them where they win.

Each engine's collectives take one tensor each (torch's order of ranks for reduce-scatter and
all-gather) and a reduce op by name; they return what the engine returns (torch's ``Work``, or
None for MPI, which has ended by then). ``ops`` is what the engine reduces itself; AVG on an
engine without it runs as SUM and a division (``divide_after``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
              "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
              "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def op_name(op) -> str | None:
    """gradsync's name of torch's ReduceOp (an object or its enum value), None for one it has
    no name for (PREMUL_SUM).

    >>> op_name(dist.ReduceOp.AVG), op_name(dist.ReduceOp.MAX)
    ('avg', 'max')
    """
    for name, value in REDUCE_OPS.items():
        if op == value:
            return name
    return None


def _options(cls, **fields):
    opts = cls()
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts


class TorchEngine:
    """A torch.distributed process group's own collectives (Gloo on CPU tensors, NCCL on CUDA).

    Example, after ``dist.init_process_group("gloo", ...)``:
    ``TorchEngine(dist.group.WORLD).all_reduce(t, "sum").wait()``.
    """

    def __init__(self, group):
        self.group = group
        self.name = group.name().lower() if hasattr(group, "name") else "gloo"
        self.ops = ("sum", "product", "min", "max", "band", "bor", "bxor") + (("avg",) if self.name == "nccl" else ())

    def divide_after(self, op: str) -> bool:
        """Whether ``op`` runs as SUM here, the caller dividing after (AVG on Gloo)."""
        return op == "avg" and "avg" not in self.ops

    def takes(self, kind: str, dtype, op) -> bool:
        """Whether the engine runs this call (Gloo and NCCL: every dtype and op torch passes on)."""
        return True

    def all_reduce(self, tensor: torch.Tensor, op: str):
        op = "sum" if self.divide_after(op) else op
        return self.group.allreduce([tensor], _options(dist.AllreduceOptions, reduceOp=REDUCE_OPS[op]))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str):
        op = "sum" if self.divide_after(op) else op
        return self.group._reduce_scatter_base(out, inp, _options(dist.ReduceScatterOptions, reduceOp=REDUCE_OPS[op]))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor):
        return self.group._allgather_base(out, inp, dist.distributed_c10d.AllgatherOptions())

    def broadcast(self, tensor: torch.Tensor, root: int):
        return self.group.broadcast([tensor], _options(dist.BroadcastOptions, rootRank=root))

    def barrier(self):
        return self.group.barrier(dist.BarrierOptions())


class MpiEngine:
    """Open MPI's own collectives through mpi4py (host buffers: CPU tensors), blocking.

    Example, under ``mpirun``: ``MpiEngine(MPI.COMM_WORLD).all_reduce(t, "sum")``.
    """

    name = "mpi"
    ops = ("sum", "product", "min", "max", "band", "bor", "bxor")

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm, self.mpi = comm, MPI
        self._ops = {"sum": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND,
                     "bor": MPI.BOR, "bxor": MPI.BXOR}

    def divide_after(self, op: str) -> bool:
        return op == "avg"

    def takes(self, kind: str, dtype, op) -> bool:
        """MPI reduces no 16-bit floats; bool only by its logical ops."""
        return dtype not in (torch.float16, torch.bfloat16, torch.bool)

    @staticmethod
    def _buf(tensor: torch.Tensor):
        return tensor.detach().numpy()

    def all_reduce(self, tensor: torch.Tensor, op: str):
        self.comm.Allreduce(self.mpi.IN_PLACE, self._buf(tensor), op=self._ops["sum" if op == "avg" else op])

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str):
        self.comm.Reduce_scatter_block(self._buf(inp), self._buf(out), op=self._ops["sum" if op == "avg" else op])

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor):
        self.comm.Allgather(self._buf(inp), self._buf(out))

    def broadcast(self, tensor: torch.Tensor, root: int):
        self.comm.Bcast(self._buf(tensor), root=root)

    def barrier(self):
        self.comm.Barrier()
