"""Bodies for tests/test_backend_conformance.py: each case makes the same call on a Gloo group and
on a gradsync group, in the same processes, and says what happened on each (the values left in
the tensors, the future's value, or the exception's type and first line).

The cases are the ones PyTorch's own collective tests (test/distributed/test_c10d_gloo.py, run by
benchmarks/c10d_conformance.py) found to differ, and their neighbours: the call forms torch's
``ProcessGroup`` takes (lists of several tensors, bare tensors, keyword roots), bad arguments Gloo
refuses, layouts and dtypes Gloo takes. Data are small integers, exact in every dtype and every
order of summation, so the two results compare exactly. Every case gets a fresh group of each
backend (a case that leaves one behind cannot spill into the next).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import gradsync.distributed
from gradsync.distributed import configure

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
# the gradsync choices the cases run under: "auto" with measuring off is the engine's collective
# behind auto's own path (deterministic; what auto measures would make the route vary by machine)
PROFILES = {
    "auto": dict.fromkeys(KINDS, "auto"),
    "ring": dict(all_reduce="ring", reduce_scatter="ring", all_gather="ring", broadcast="tree", barrier="engine"),
    "one_host": dict.fromkeys(KINDS, "one_host"),
}
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
          "complex64")
CASE_TIMEOUT = datetime.timedelta(seconds=15)

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# --- what happened, in a form two backends' runs compare by -----------------------------------
def described(value):
    """Tensors as (dtype, shape, layout, values); lists, tuples and dicts element by element."""
    if isinstance(value, torch.Tensor):
        if value.is_sparse:
            value = value.coalesce()
            return {"sparse": list(value.shape), "indices": value.indices().tolist(),
                    "values": described(value.values())}
        if value.device.type == "meta":
            return {"meta": list(value.shape), "dtype": str(value.dtype)}
        data = value.detach()
        if data.is_complex():
            data = torch.view_as_real(data)
        if data.dtype in (torch.float16, torch.bfloat16, torch.float32):
            data = data.double()
        return {"dtype": str(value.dtype), "shape": list(value.shape), "values": data.tolist()}
    if isinstance(value, (list, tuple)):
        return [described(v) for v in value]
    if isinstance(value, dict):
        return {k: described(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def outcome(fn, group, rank: int, workers: int) -> dict:
    """``fn(group, rank, workers)``'s value, described, or the exception it raised."""
    try:
        return {"value": described(fn(group, rank, workers))}
    except Exception as exc:     # noqa: BLE001 -- what was raised is the result
        return {"raised": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": (str(exc).splitlines() or [""])[0][:300]}


def run_cases(rank: int, workers: int, plan) -> dict:
    """In each rank of the launcher's Gloo world: every (profile, case) of ``plan``, each on a
    fresh Gloo group and a fresh gradsync group. {(profile, case): {"gloo": ..., "gradsync": ...}}."""
    gradsync.distributed.register()
    out = {}
    for profile, name in plan:
        configure(**{k: None for k in gradsync.distributed.config.SETTINGS})
        configure(**PROFILES[profile])
        row, started = {}, time.monotonic()
        for backend in ("gloo", "gradsync"):
            group = dist.new_group(backend=backend, timeout=CASE_TIMEOUT)
            row[backend] = outcome(CASES[name], group, rank, workers)
            dist.destroy_process_group(group)
        row["seconds"] = time.monotonic() - started
        out[(profile, name)] = row
        dist.barrier()                       # the world (Gloo): every rank done with this case
    configure(**{k: None for k in gradsync.distributed.config.SETTINGS})
    return out


def _ints(rank: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """``n`` small integers (exact in every dtype), different per rank and ``salt``."""
    g = torch.Generator().manual_seed(100 * salt + rank)
    return torch.randint(0, 5, (n,), generator=g).to(dtype)


# --- all-reduce ---------------------------------------------------------------------------------
@case
def allreduce_tensor_list(pg, rank, workers):
    """Two tensors in one call: Gloo sums across the list and the ranks."""
    tensors = [torch.tensor([2.0 * rank]), torch.tensor([2.0 * rank + 1])]
    future = pg.allreduce(tensors).get_future()
    return {"future": future.wait(), "tensors": tensors}


@case
def allreduce_tensor_list_ops(pg, rank, workers):
    """Two tensors in one call under PRODUCT, MIN, MAX (Gloo reduces across the list too)."""
    out = {}
    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, op)
        tensors = [torch.tensor([2.0 * rank + 1]), torch.tensor([2.0 * rank + 2])]
        pg.allreduce(tensors, opts).wait()
        out[op] = tensors
    return out


@case
def allreduce_bare_tensor(pg, rank, workers):
    """``pg.allreduce(t)``: torch's ProcessGroup takes a bare tensor (op SUM)."""
    t = torch.tensor([rank + 1.0, 10.0 * rank])
    future = pg.allreduce(t).get_future()
    return {"future": future.wait(), "tensor": t}


@case
def allreduce_bare_tensor_2d(pg, rank, workers):
    """A bare 2-D tensor (test_barrier_implies_wait's 100 x 100), several in flight, then a barrier."""
    tensors = [torch.full((4, 3), float(i + rank)) for i in range(3)]
    for t in tensors:
        pg.allreduce(t)
    pg.barrier().get_future().wait()
    return tensors


@case
def allreduce_bare_one_element(pg, rank, workers):
    """A bare one-element tensor (test_allreduce_stress): the future's tensor keeps its shape."""
    t = torch.tensor([rank + 1])
    return pg.allreduce(t).get_future().wait()


@case
def allreduce_op_keyword(pg, rank, workers):
    """``pg.allreduce([t], op=ReduceOp.MAX)``: the options as a keyword ReduceOp."""
    t = torch.tensor([rank + 1.0])
    pg.allreduce([t], op=dist.ReduceOp.MAX).wait()
    return t


@case
def allreduce_empty_list(pg, rank, workers):
    return pg.allreduce([], dist.AllreduceOptions()).get_future().wait()


@case
def allreduce_mixed_dtypes(pg, rank, workers):
    return pg.allreduce([torch.zeros(1), torch.zeros(1, dtype=torch.float64)], dist.AllreduceOptions()).wait()


@case
def allreduce_mixed_sizes(pg, rank, workers):
    return pg.allreduce([torch.zeros(1), torch.zeros(2)], dist.AllreduceOptions()).wait()


@case
def allreduce_future_value(pg, rank, workers):
    t = _ints(rank, 5)
    return pg.allreduce([t]).get_future().wait()


def matrix_input(rank: int, key: str) -> torch.Tensor:
    """The tensor rank ``rank`` passes for matrix entry ``key`` ("OP/dtype"): small integers,
    exact in every dtype; for bool, a pattern that differs by rank."""
    op, dtype = key.split("/")
    if dtype == "bool":
        return torch.tensor([rank % 2 == 0, True, False, rank == 0])
    return _ints(rank, 4, salt=OPS.index(op) * len(DTYPES) + DTYPES.index(dtype)).to(getattr(torch, dtype))


MATRIX = [f"{op}/{dtype}" for op in OPS for dtype in DTYPES]


def _matrix(call, pg, rank, workers) -> dict:
    return {key: outcome(lambda g, r, w: call(matrix_input(r, key), getattr(dist.ReduceOp, key.split("/")[0]), g),
                         pg, rank, workers) for key in MATRIX}


@case
def all_reduce_every_op_and_dtype(pg, rank, workers):
    """dist.all_reduce with every ReduceOp on every dtype: per "OP/dtype", the value or what was raised."""
    def call(t, op, group):
        dist.all_reduce(t, op=op, group=group)
        return t
    return _matrix(call, pg, rank, workers)


@case
def reduce_scatter_every_op_and_dtype(pg, rank, workers):
    """dist.reduce_scatter_tensor of every rank's ``matrix_input`` repeated N times (each rank's chunk
    is that input): per "OP/dtype", the chunk or what was raised."""
    def call(t, op, group):
        out = torch.empty_like(t)
        dist.reduce_scatter_tensor(out, t.repeat(workers), op=op, group=group)
        return out
    return _matrix(call, pg, rank, workers)


@case
def all_gather_every_dtype(pg, rank, workers):
    """dist.all_gather_into_tensor on every dtype (the key's op is SUM, unused)."""
    def call(t, op, group):
        out = torch.empty(t.numel() * workers, dtype=t.dtype)
        dist.all_gather_into_tensor(out, t, group=group)
        return out
    return {key: outcome(lambda g, r, w: call(matrix_input(r, key), None, g), pg, rank, workers)
            for key in MATRIX if key.startswith("SUM/")}


@case
def broadcast_every_dtype(pg, rank, workers):
    """dist.broadcast from the last rank on every dtype."""
    def call(t, group):
        dist.broadcast(t, src=workers - 1, group=group)
        return t
    return {key: outcome(lambda g, r, w: call(matrix_input(r, key), g), pg, rank, workers)
            for key in MATRIX if key.startswith("SUM/")}


@case
def all_reduce_premul_sum(pg, rank, workers):
    t = _ints(rank, 4)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0), group=pg)
    return t


@case
def all_reduce_sparse(pg, rank, workers):
    """A sparse tensor (DDP's sparse gradients): Gloo sums it."""
    t = torch.sparse_coo_tensor([[rank % 3, 4]], [float(rank + 1), 1.0], size=(6,))
    dist.all_reduce(t, group=pg)
    return t


@case
def allreduce_sparse_list(pg, rank, workers):
    """pg.allreduce of sparse tensors, one and two per call (test_sparse_allreduce_basics)."""
    out = []
    for n in (1, 2):
        tensors = [torch.sparse_coo_tensor([[rank + i]], [float(rank + 1)], size=(workers + 2,)) for i in range(n)]
        out.append(pg.allreduce(tensors).get_future().wait())
    return out


@case
def all_reduce_noncontiguous(pg, rank, workers):
    t = (torch.arange(12.0).view(3, 4) + rank).t()
    dist.all_reduce(t, group=pg)
    return {"values": t, "contiguous": t.is_contiguous()}


@case
def all_reduce_zero_size(pg, rank, workers):
    t = torch.empty(0, 3)
    dist.all_reduce(t, group=pg)
    return t


@case
def all_reduce_meta(pg, rank, workers):
    t = torch.empty(4, device="meta")
    dist.all_reduce(t, group=pg)
    return t


@case
def all_reduce_bool(pg, rank, workers):
    t = torch.tensor([rank % 2 == 0, True, False])
    dist.all_reduce(t, group=pg)
    return t


@case
def all_reduce_inference_mode(pg, rank, workers):
    with torch.inference_mode():
        t = _ints(rank, 6)
        dist.all_reduce(t, group=pg)
    return t


@case
def inference_mode_then_training(pg, rank, workers):
    """An all-reduce of an inference tensor (an eval loop's metric), then an ordinary one: Gloo
    does both; the group must still work after the first."""
    with torch.inference_mode():
        metric = _ints(rank, 5)
        first = outcome(lambda g, r, w: _all_reduced(metric, g), pg, rank, workers)
    second = _ints(rank, 5, salt=1)
    dist.all_reduce(second, group=pg)
    return {"inference": first, "after": second}


@case
def first_call_in_inference_mode(pg, rank, workers):
    """The group's first collective called inside inference mode on an ordinary tensor, then one
    outside it."""
    t = _ints(rank, 5)
    with torch.inference_mode():
        dist.all_reduce(t, group=pg)
    after = _ints(rank, 5, salt=1)
    dist.all_reduce(after, group=pg)
    return {"inside": t, "after": after}


def _all_reduced(t, group):
    dist.all_reduce(t, group=group)
    return t


# --- all-gather ---------------------------------------------------------------------------------
@case
def allgather_future_value(pg, rank, workers):
    """One input: Gloo's future holds the output list itself, [t0, ..., tN-1]."""
    output = [[torch.tensor([-1.0]) for _ in range(workers)]]
    future = pg.allgather(output, [torch.tensor([float(rank)])]).get_future()
    return {"future": future.wait(), "output": output}


@case
def allgather_several_inputs(pg, rank, workers):
    """n inputs per rank, n output lists of n x N (test_allgather_basics, n = 2, 3)."""
    out = []
    for n in (2, 3):
        inputs = [torch.tensor([float(n * rank + i)]) for i in range(n)]
        output = [[torch.tensor([-1.0]) for _ in range(n * workers)] for _ in range(n)]
        out.append({"future": pg.allgather(output, inputs).get_future().wait(), "output": output})
    return out


@case
def allgather_empty_lists(pg, rank, workers):
    return pg.allgather([], []).get_future().wait()


@case
def allgather_noncontiguous_input(pg, rank, workers):
    t = torch.tensor([float(rank)]).expand(2, 2).contiguous()[:, 0]
    output = [[torch.tensor([-1.0, -1.0]) for _ in range(workers)]]
    pg.allgather(output, [t]).wait()
    return output


@case
def all_gather_list_inference_mode(pg, rank, workers):
    with torch.inference_mode():
        output = [torch.empty(3) for _ in range(workers)]
        dist.all_gather(output, _ints(rank, 3), group=pg)
    return output


@case
def all_gather_into_tensor_inference_mode(pg, rank, workers):
    with torch.inference_mode():
        output = torch.empty(3 * workers)
        dist.all_gather_into_tensor(output, _ints(rank, 3), group=pg)
    return output


@case
def all_gather_into_tensor_strided_output(pg, rank, workers):
    """A non-contiguous output: every second element of a longer tensor (Gloo takes it)."""
    output = torch.full((2 * 3 * workers,), -1.0)[::2]
    dist.all_gather_into_tensor(output, _ints(rank, 3), group=pg)
    return output


@case
def reduce_scatter_tensor_strided_output(pg, rank, workers):
    output = torch.full((6,), -1.0)[::2]
    dist.reduce_scatter_tensor(output, _ints(rank, 3 * workers), group=pg)
    return output


@case
def all_gather_into_tensor_coalesced(pg, rank, workers):
    inputs = [_ints(rank, 4, salt=s).view(2, 2) for s in range(3)]
    outputs = [torch.empty(2 * workers, 2) for _ in inputs]
    pg.allgather_into_tensor_coalesced(outputs, inputs).wait()
    return outputs


@case
def all_gather_bool(pg, rank, workers):
    output = [torch.zeros(2, dtype=torch.bool) for _ in range(workers)]
    dist.all_gather(output, torch.tensor([rank % 2 == 0, True]), group=pg)
    return output


@case
def all_gather_zero_size(pg, rank, workers):
    output = torch.empty(0)
    dist.all_gather_into_tensor(output, torch.empty(0), group=pg)
    return output


@case
def all_gather_complex(pg, rank, workers):
    output = [torch.zeros(2, dtype=torch.complex64) for _ in range(workers)]
    dist.all_gather(output, torch.tensor([rank + 1j, 2.0 - rank * 1j], dtype=torch.complex64), group=pg)
    return output


# --- reduce-scatter -----------------------------------------------------------------------------
@case
def reduce_scatter_uneven_lists(pg, rank, workers):
    """Chunk i of i elements (test_reduce_scatter): every rank's list the same shapes."""
    inputs = [_ints(rank, i, salt=i) for i in range(workers)]
    output = torch.empty(rank)
    dist.reduce_scatter(output, inputs, group=pg)
    return output


@case
def reduce_scatter_tensor_coalesced(pg, rank, workers):
    inputs = [_ints(rank, 2 * workers * (s + 1), salt=s).view(workers, 2 * (s + 1)) for s in range(3)]
    outputs = [torch.empty(1, 2 * (s + 1)) for s in range(3)]
    pg.reduce_scatter_tensor_coalesced(outputs, inputs).wait()
    return outputs


@case
def reduce_scatter_tensor_bool(pg, rank, workers):
    output = torch.zeros(2, dtype=torch.bool)
    dist.reduce_scatter_tensor(output, torch.tensor([rank % 2 == 0, False] * workers), group=pg)
    return output


@case
def reduce_scatter_tensor_max(pg, rank, workers):
    output = torch.empty(3)
    dist.reduce_scatter_tensor(output, _ints(rank, 3 * workers), op=dist.ReduceOp.MAX, group=pg)
    return output


@case
def reduce_scatter_zero_size(pg, rank, workers):
    output = torch.empty(0)
    dist.reduce_scatter_tensor(output, torch.empty(0), group=pg)
    return output


@case
def reduce_scatter_noncontiguous_input(pg, rank, workers):
    whole = _ints(rank, 2 * workers).view(2, workers).t()       # (workers, 2), not contiguous
    output = torch.empty(1, 2)
    dist.reduce_scatter_tensor(output, whole, group=pg)
    return output


# --- broadcast ----------------------------------------------------------------------------------
@case
def broadcast_root_keyword(pg, rank, workers):
    """``pg.broadcast(t, root=0)``: torch's ProcessGroup takes a bare tensor and a keyword root."""
    t = torch.tensor([rank + 1.0])
    future = pg.broadcast(t, root=workers - 1).get_future()
    return {"future": future.wait(), "tensor": t}


@case
def broadcast_root_tensor(pg, rank, workers):
    """Two tensors, the root's second one broadcast into both (opts.rootTensor = 1)."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = workers - 1, 1
    xs = [torch.tensor([2.0 * rank]), torch.tensor([2.0 * rank + 1])]
    return pg.broadcast(xs, opts).get_future().wait()


@case
def broadcast_root_minus_one(pg, rank, workers):
    opts = dist.BroadcastOptions()
    opts.rootRank = -1
    return pg.broadcast([torch.zeros(1)], opts).wait()


@case
def broadcast_root_tensor_minus_one(pg, rank, workers):
    """One tensor and opts.rootTensor = -1 (PyTorch's test_broadcast_checks): Gloo refuses it at once."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, -1
    return pg.broadcast([torch.zeros(1)], opts).wait()


@case
def broadcast_root_tensor_past_the_end(pg, rank, workers):
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 1
    return pg.broadcast([torch.zeros(1)], opts).wait()


@case
def broadcast_root_past_the_end(pg, rank, workers):
    opts = dist.BroadcastOptions()
    opts.rootRank = workers
    return pg.broadcast([torch.zeros(1)], opts).wait()


@case
def broadcast_empty_list(pg, rank, workers):
    opts = dist.BroadcastOptions()
    opts.rootRank = rank
    return pg.broadcast([], opts).wait()


@case
def broadcast_bool(pg, rank, workers):
    """test_bool_tensors: a bool tensor broadcast from rank 0."""
    t = torch.tensor([True, False, False, True]) if rank == 0 else torch.zeros(4, dtype=torch.bool)
    dist.broadcast(t, src=0, group=pg)
    return t


@case
def broadcast_zero_size(pg, rank, workers):
    xs = [torch.FloatTensor([])]
    return pg.broadcast(xs).get_future().wait()


@case
def broadcast_noncontiguous(pg, rank, workers):
    t = (torch.arange(6.0).view(2, 3) * (rank + 1)).t()
    dist.broadcast(t, src=workers - 1, group=pg)
    return t


@case
def broadcast_stress(pg, rank, workers):
    """Many broadcasts in flight at once, each from another root (test_broadcast_stress, 60 not 1000)."""
    inputs = [torch.tensor([i * workers + rank]) for i in range(60)]
    works = [pg.broadcast(inputs[i], root=i % workers) for i in range(len(inputs))]
    for w in works:
        w.wait()
    return inputs


# --- gather (the engine's), barriers, coalesced forms, DDP -------------------------------------------------------------
@case
def gather_future_value(pg, rank, workers):
    """Gloo's gather future holds the root's output list, [t0, ..., tN-1] (test_gather_basics)."""
    opts = dist.GatherOptions()
    opts.rootRank = workers - 1
    outputs = [[torch.tensor([-1.0]) for _ in range(workers)]] if rank == workers - 1 else []
    return pg.gather(outputs, [torch.tensor([float(rank)])], opts).get_future().wait()


@case
def shorthand_allgather(pg, rank, workers):
    """pg.allgather(outputs, t): one input tensor, one output list."""
    outputs = [torch.empty(2) for _ in range(workers)]
    pg.allgather(outputs, _ints(rank, 2)).wait()
    return outputs


@case
def shorthand_gather(pg, rank, workers):
    """pg.gather(outputs, t, root)."""
    root = workers - 1
    outputs = [torch.empty(2) for _ in range(workers)] if rank == root else []
    pg.gather(outputs, _ints(rank, 2), root).wait()
    return outputs


@case
def shorthand_scatter(pg, rank, workers):
    """pg.scatter(output, inputs, root)."""
    output = torch.empty(2)
    inputs = [_ints(r, 2, salt=7) for r in range(workers)] if rank == 0 else []
    pg.scatter(output, inputs, 0).wait()
    return output


@case
def shorthand_reduce(pg, rank, workers):
    """pg.reduce(t, root, op)."""
    t = _ints(rank, 3)
    pg.reduce(t, 0, dist.ReduceOp.MAX).wait()
    return t if rank == 0 else None


@case
def shorthand_reduce_scatter(pg, rank, workers):
    """pg.reduce_scatter(output, inputs, op): one output, one list."""
    output = torch.empty(2)
    pg.reduce_scatter(output, [_ints(rank, 2, salt=r) for r in range(workers)], dist.ReduceOp.SUM).wait()
    return output


@case
def barrier_timeout_keyword(pg, rank, workers):
    """pg.barrier(timeout=...)."""
    return pg.barrier(timeout=datetime.timedelta(seconds=10)).wait()


@case
def monitored_barrier(pg, rank, workers):
    return dist.monitored_barrier(group=pg, timeout=datetime.timedelta(seconds=10))


@case
def all_reduce_coalesced(pg, rank, workers):
    tensors = [_ints(rank, 3), _ints(rank, 2, salt=1)]
    dist.all_reduce_coalesced(tensors, group=pg)
    return tensors


@case
def ddp_sparse_gradients(pg, rank, workers):
    """DDP on an EmbeddingBag with sparse gradients (test_sparse_gradients): the gradient."""
    torch.manual_seed(1337)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.EmbeddingBag(10, 4, sparse=True), process_group=pg)
    x = torch.tensor([[rank, (rank + 3) % 10]])
    net(x).sum().backward()
    return net.module.weight.grad


@case
def ddp_dense_gradients(pg, rank, workers):
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2), process_group=pg)
    net(torch.full((2, 3), float(rank + 1))).sum().backward()
    return [p.grad for p in net.parameters()]



# --- ranks that disagree: not Gloo's behaviour (it gives rank 0 a wrong sum, or aborts) ------------
MISMATCH_TIMEOUT = 8.0


def mismatched_across_ranks(rank: int, workers: int, profile: str, what: str) -> dict:
    """An all_reduce whose ranks pass different shapes (``what`` "shape") or dtypes ("dtype") on a
    gradsync group: what this rank got (value or exception) and how many seconds it took. One
    launch each: Gloo aborts a process on mismatched dtypes."""
    gradsync.distributed.register()
    configure(**PROFILES[profile])
    group = dist.new_group(backend="gradsync", timeout=datetime.timedelta(seconds=MISMATCH_TIMEOUT))
    t = torch.ones(4 + rank) if what == "shape" else torch.ones(4, dtype=torch.float64 if rank == 0 else torch.float32)
    started = time.monotonic()
    out = outcome(lambda g, r, w: _all_reduced(t, g), group, rank, workers)
    out["seconds"] = time.monotonic() - started
    return out
