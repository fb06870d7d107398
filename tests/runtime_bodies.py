"""Bodies run in worker processes by tests/test_runtime.py (importable by spawned children)."""

import os
import time

import torch
import torch.distributed as dist

import gradsync
from gradsync.errors import GradsyncError
from gradsync.integrations.kvstore import KVStore
from gradsync.integrations.bucketing import all_reduce_coalesced

DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]


def inputs(rank, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)


def reference(workers, n, dtype, seed=0):
    return sum(inputs(r, n, dtype, seed).double() for r in range(workers))


def every_algorithm(rank, workers):
    """Max relative error per (algorithm, dtype, length) against the float64 sum of the inputs."""
    out = {}
    for alg in gradsync.ALGORITHMS:
        for dtype in DTYPES:
            if alg == "cerar" and dtype not in (torch.float32, torch.float64):
                continue
            for n in (0, 1, 2, workers - 1, 13, 1000):
                x = inputs(rank, n, dtype)
                opts = {"components": workers} if alg == "cerar" else {}
                gradsync.all_reduce(x, algorithm=alg, **opts)
                ref = reference(workers, n, dtype)
                scale = ref.abs().max().item() if n else 1.0
                out[(alg, str(dtype), n)] = (x.double() - ref).abs().max().item() / (scale or 1.0) if n else 0.0
    return out


def shapes_and_ops(rank, workers):
    """Non-contiguous tensors, 2-D shapes, average, CERAR with c > N, auto."""
    base = inputs(rank, 60, torch.float64).view(6, 10)
    t = base.t()                                   # non-contiguous view
    gradsync.all_reduce(t, algorithm="halving_doubling")
    ref = reference(workers, 60, torch.float64).view(6, 10).t()
    avg = inputs(rank, 100, torch.float32)
    gradsync.all_reduce(avg, algorithm="tree", op="avg")
    approx = inputs(rank, 5000, torch.float32)
    gradsync.all_reduce(approx, algorithm="cerar", components=2 * workers)
    auto = inputs(rank, 3000, torch.float32)
    gradsync.all_reduce(auto, algorithm="auto")
    return {"noncontiguous": (t - ref).abs().max().item(), "base_is_view": bool(torch.equal(base.t(), t)),
            "avg": (avg.double() - reference(workers, 100, torch.float32) / workers).abs().max().item(),
            "cerar": ((approx.double() - reference(workers, 5000, torch.float32)).norm()
                      / reference(workers, 5000, torch.float32).norm()).item(),
            "auto": (auto.double() - reference(workers, 3000, torch.float32)).abs().max().item(),
            "cerar_result": approx[:5].tolist()}


def mismatch(rank, workers):
    """Rank 1 calls with a different length: everyone must raise before any data moves."""
    x = torch.ones(10 if rank != 1 else 11)
    try:
        gradsync.all_reduce(x, algorithm="ring")
        return "no error"
    except gradsync.MismatchError as exc:
        return {"message": str(exc), "untouched": bool(torch.equal(x, torch.ones_like(x)))}


def dead_peer(rank, workers, algorithm, timeout, check):
    """The last rank exits at once; the others must raise PeerError within the timeout."""
    if rank == workers - 1:
        os._exit(0)
    x = torch.ones(1 << 16)
    start = time.monotonic()
    try:
        gradsync.all_reduce(x, algorithm=algorithm, timeout=timeout, check=check)
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}


def stalled_peer(rank, workers, timeout):
    """Rank 0 sleeps past the timeout; its peers must time out naming a rank."""
    if rank == 0:
        time.sleep(timeout + 3)
        return {"slept": True}
    start = time.monotonic()
    try:
        gradsync.all_reduce(torch.ones(100), algorithm="ring", timeout=timeout, check=False)
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer, "seconds": time.monotonic() - start}


def kvstore(rank, workers):
    out = {}
    for strategy in ("sharded", "central", "host", "ring", "tree", "halving_doubling"):
        kv = KVStore(strategy, updater=lambda key, grad, weight: weight.sub_(0.5 * grad))
        kv.init("w", torch.arange(12, dtype=torch.float32))
        kv.push("w", torch.full((12,), float(rank + 1)))
        pulled = kv.pull("w", torch.empty(12))
        plain = KVStore(strategy)
        plain.init("g", torch.zeros(7, dtype=torch.float64))
        plain.push("g", [torch.ones(7, dtype=torch.float64), torch.ones(7, dtype=torch.float64) * rank])
        listed = plain.pull("g", torch.empty(7, dtype=torch.float64))
        summed = plain.pushpull("g", [torch.ones(7, dtype=torch.float64)], torch.empty(7, dtype=torch.float64))
        out[strategy] = {"pulled": pulled.tolist(), "listed": listed.tolist(), "summed": summed.tolist()}
    return out


def bucketed(rank, workers):
    tensors = [inputs(rank, n, torch.float64, seed=i) for i, n in enumerate([1, 5, 1000, 3, 70000, 2])]
    all_reduce_coalesced(tensors, bucket_bytes=8000, algorithm="ring")
    refs = [reference(workers, n, torch.float64, seed=i) for i, n in enumerate([1, 5, 1000, 3, 70000, 2])]
    return max((t - r).abs().max().item() for t, r in zip(tensors, refs))


def ddp_hook(rank, workers, algorithm, options):
    """Gradients after one DDP step with a gradsync hook, and with DDP's own all-reduce."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsync.torch import comm_hook

    grads = {}
    for name in ("default", "gradsync"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
        model = DistributedDataParallel(net)
        if name == "gradsync":
            model.register_comm_hook(None, comm_hook(algorithm, **options))
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(16, 20, generator=g), torch.randn(16, 5, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return ((grads["gradsync"] - grads["default"]).norm() / grads["default"].norm()).item()


def fails(rank, workers):
    if rank == 1:
        raise ValueError("boom on purpose")
    return rank


def non_finite(rank, workers):
    """Rank 2 holds a NaN: with check_finite, everyone raises naming it; without, NaN spreads."""
    x = torch.ones(50)
    if rank == 2:
        x[7] = float("nan")
    try:
        gradsync.all_reduce(x, check_finite=True)
        caught = None
    except gradsync.MismatchError as exc:
        caught = str(exc)
    y = x.clone()
    gradsync.all_reduce(y)
    return {"caught": caught, "untouched": bool(torch.equal(x[:7], torch.ones(7))), "spread": bool(y.isnan().any())}


def straggler(rank, workers, delay):
    """Rank 0 starts late; the others warn (logging) before finishing normally."""
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("gradsync").addHandler(handler)
    if rank == 0:
        time.sleep(delay)
    x = torch.ones(10)
    gradsync.all_reduce(x, timeout=delay + 10, stall_warning=delay / 3, check=False)
    return {"warnings": records, "sum": x.tolist()}


def timed_ring(rank, workers, elements):
    """Median seconds of a ring all-reduce of ``elements`` float32 (3 runs after a warm-up)."""
    import statistics
    x = torch.randn(elements)
    gradsync.all_reduce(x)
    times = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        gradsync.all_reduce(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def listening_addresses(rank, workers):
    """The local addresses of every TCP socket this process listens on, after an all-reduce."""
    import os
    import socket
    import struct
    x = torch.ones(3)
    gradsync.all_reduce(x)
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:           # LISTEN, one of ours
                raw = bytes.fromhex(fields[1].split(":")[0])
                words = b"".join(struct.pack("<I", w) for w in struct.unpack(f">{len(raw) // 4}I", raw))
                found.append(socket.inet_ntop(family, words))
    return found


def late_to_a_dead_peer(rank, workers):
    """Rank 1 exits; rank 0 starts its all-reduce once the connection is known closed, so
    posting the first operation fails at once: still a PeerError naming rank 1."""
    if rank == 1:
        os._exit(0)
    time.sleep(1.5)
    try:
        gradsync.all_reduce(torch.ones(1 << 16), timeout=3.0, check=False)
        return {"error": None}
    except gradsync.PeerError as exc:
        return {"error": str(exc), "peer": exc.peer}


def cerar_in_pieces(rank, workers):
    """CERAR on gradients large enough to travel in several pieces per round (with padding)."""
    n = workers * 700_001 + 1
    exact = inputs(rank, n, torch.float64)
    gradsync.all_reduce(exact, algorithm="cerar", components=workers)          # c = N: exact design
    approx = inputs(rank, n, torch.float32)
    gradsync.all_reduce(approx, algorithm="cerar", components=2 * workers)
    ref64, ref32 = reference(workers, n, torch.float64), reference(workers, n, torch.float32)
    return {"exact": ((exact - ref64).abs().max() / ref64.abs().max()).item(),
            "approx": ((approx.double() - ref32).norm() / ref32.norm()).item()}


def openmp_threads(rank, workers):
    return {"env": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()}


def elastic_agreement(rank, workers, weight_nudge, step_nudge):
    """The elastic workers' post-recovery check on identical replicas, except that rank 1
    nudges one weight by ``weight_nudge`` and its step by ``step_nudge``."""
    from gradsync.training import elastic

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()                       # creates the momentum buffers the digest covers
    if rank == 1:
        with torch.no_grad():
            model.weight[0, 0] += weight_nudge
    try:
        return {"digest": elastic._agree(model, optimizer, 7 + (step_nudge if rank == 1 else 0))}
    except GradsyncError as exc:
        return {"error": str(exc)}


class _Bucket:
    """What DDP hands a communication hook, as far as the hook reads it."""

    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor


def hook_while_peer_is_slow(rank, workers, delay, transport="gloo", warm=False):
    """Rank 0 starts a bucket's all-reduce while rank 1 is ``delay`` s late: how long the hook
    took to return, whether its future was done then, and the averaged result after waiting.
    ``warm``: one bucket goes through the hook first, on every rank together."""
    from gradsync.torch import comm_hook

    hook = comm_hook("ring", transport=transport)
    tensor = torch.full((100_000,), float(rank + 1))
    if warm:
        hook(None, _Bucket(tensor.clone())).wait()
    dist.barrier()
    if rank == 1:
        time.sleep(delay)
    start = time.perf_counter()
    future = hook(None, _Bucket(tensor))
    returned, done = time.perf_counter() - start, future.done()
    result = future.wait()
    expected = sum(range(1, workers + 1)) / workers
    return {"returned_s": returned, "done_at_return": done, "error": (result - expected).abs().max().item()}


def overlapped_training(rank, workers, algorithm, steps):
    """Parameters after ``steps`` SGD steps of DDP with buckets overlapping backward (several
    buckets per step), with the gradsync hook and with DDP's own all-reduce; and how many
    buckets the hook synchronized in the last step."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsync.torch import comm_hook

    params, calls = {}, []
    gradsync_hook = comm_hook(algorithm)

    def counting(state, bucket):
        calls.append(1)
        return gradsync_hook(state, bucket)

    for name in ("default", "gradsync"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(256, 256, dtype=torch.float64) for _ in range(6)])
        model = DistributedDataParallel(net, bucket_cap_mb=0.5)
        if name == "gradsync":
            model.register_comm_hook(None, counting)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            x = torch.randn(8, 256, generator=g, dtype=torch.float64)
            opt.zero_grad()
            calls.clear()
            model(x).square().mean().backward()
            opt.step()
        params[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"diff": (params["gradsync"] - params["default"]).abs().max().item(), "buckets": len(calls)}


def path_to_the_wire(rank, workers):
    """The gradsync functions one all_reduce(tensor, "ring") calls, in order, up to the first
    post of its data on the transport (the agreement's digests go first): (module, function)
    pairs, read with a profile hook."""
    import sys

    calls = []

    def hook(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("gradsync."):
            calls.append((module, frame.f_code.co_name))
            caller = frame.f_back.f_globals.get("__name__", "")
            if module.startswith("gradsync.runtime.transport") and frame.f_code.co_name == "post" \
                    and caller == "gradsync.runtime.exact":
                sys.setprofile(None)

    tensor = torch.ones(1000)
    gradsync.all_reduce(tensor, "ring")          # compiled and agreed once: the steady state follows
    sys.setprofile(hook)
    gradsync.all_reduce(tensor, "ring")
    sys.setprofile(None)
    return calls
