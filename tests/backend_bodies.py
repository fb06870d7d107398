"""Bodies run in worker processes by tests/test_backend.py (importable by spawned children).

Each starts in the launcher's Gloo world and re-forms it as a "gradsync" world on the same
store (``gradsync_world``), as ``init_process_group("gradsync")`` does under torchrun. The
references are independent of gradsync: the same calls on a Gloo group, or the same model
trained in one process on every rank's batch at once.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import gradsync.distributed
from gradsync.distributed import configure

STEPS = 3


def gradsync_world(rank, workers, timeout=60.0, **choices):
    """Replace the launcher's Gloo world with a gradsync one on its store; return the store."""
    gradsync.distributed.register()
    configure(**{k: None for k in gradsync.distributed.config.SETTINGS})
    configure(**choices)
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    dist.init_process_group("gradsync", store=dist.PrefixStore("gradsync-world", store), rank=rank,
                            world_size=workers, timeout=datetime.timedelta(seconds=timeout))
    return store


EXACT = dict(all_reduce="ring", reduce_scatter="ring", all_gather="ring", broadcast="tree")


def compare_with_gloo(rank, workers):
    """Every collective on the gradsync world and on a Gloo group, side by side: max |difference|."""
    gloo = dist.new_group(backend="gloo")
    out = {}
    for name, fn in CALLS.items():
        mine, theirs = fn(rank, workers, None), fn(rank, workers, gloo)
        out[name] = max((a.double() - b.double()).abs().max().item() if a.numel() else 0.0
                        for a, b in zip(mine, theirs))
    out["backend"] = dist.get_backend()
    return out


def _data(rank, n, dtype=torch.float64, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _all_reduce(rank, workers, group, op=dist.ReduceOp.SUM):
    t = _data(rank, 1003)
    dist.all_reduce(t, op=op, group=group)
    return [t]


def _reduce_scatter(rank, workers, group, op=dist.ReduceOp.SUM):
    out = torch.empty(40, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, _data(rank, 40 * workers, salt=1), op=op, group=group)
    return [out]


def _all_gather(rank, workers, group):
    out = torch.empty(33 * workers, dtype=torch.float32)
    dist.all_gather_into_tensor(out, _data(rank, 33, torch.float32, salt=2), group=group)
    lists = [torch.empty(5, dtype=torch.float64) for _ in range(workers)]
    dist.all_gather(lists, _data(rank, 5, salt=3), group=group)
    return [out, *lists]


def _broadcast(rank, workers, group):
    t = _data(rank, 77, salt=4)
    dist.broadcast(t, src=workers - 1, group=group)
    dist.barrier(group=group)
    return [t]


def _engine_ones(rank, workers, group):
    outs = [torch.empty(3, dtype=torch.float64) for _ in range(workers)]
    dist.all_to_all(outs, [_data(rank, 3, salt=10 + r) for r in range(workers)], group=group)
    single = torch.empty(2 * workers, dtype=torch.float64)
    dist.all_to_all_single(single, _data(rank, 2 * workers, salt=5), group=group)
    return [*outs, single]


def _rooted(rank, workers, group):
    """gather, scatter and reduce to the last rank (the engine's), and a coalesced all-reduce."""
    root = workers - 1
    t = _data(rank, 4, salt=7)
    gathered = [torch.empty(4, dtype=torch.float64) for _ in range(workers)] if rank == root else None
    dist.gather(t, gathered, dst=root, group=group)
    got = torch.empty(4, dtype=torch.float64)
    dist.scatter(got, [_data(r, 4, salt=8) for r in range(workers)] if rank == root else None, src=root,
                 group=group)
    reduced = _data(rank, 4, salt=9)
    dist.reduce(reduced, dst=root, group=group)
    pair = [_data(rank, 3, salt=11), _data(rank, 5, salt=12)]
    dist.all_reduce_coalesced(pair, group=group)
    return [*(gathered or []), got, reduced if rank == root else torch.zeros(0), *pair]


def _send_recv(rank, workers, group):
    t = _data(rank, 9, salt=6)
    peer = rank ^ 1
    if peer < workers:
        got = torch.empty(9, dtype=torch.float64)
        reqs = [dist.isend(t, dist.get_global_rank(group, peer) if group is not None else peer, group=group),
                dist.irecv(got, dist.get_global_rank(group, peer) if group is not None else peer, group=group)]
        for r in reqs:
            r.wait()
        return [got]
    return [t]


CALLS = {"all_reduce": _all_reduce, "max": lambda r, w, g: _all_reduce(r, w, g, dist.ReduceOp.MAX),
         "avg": lambda r, w, g: _all_reduce(r, w, g, dist.ReduceOp.AVG),
         "reduce_scatter": _reduce_scatter, "reduce_scatter_avg": lambda r, w, g: _reduce_scatter(
             r, w, g, dist.ReduceOp.AVG),
         "all_gather": _all_gather, "broadcast": _broadcast, "engine": _engine_ones, "rooted": _rooted, "send_recv": _send_recv}


# --- training: DDP, FSDP2, HSDP against one process that sees every rank's batch ------------
def model(layers=4, width=16):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers)]).double()


def batch(rank, step, width=16, rows=8):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, width, generator=g, dtype=torch.float64), torch.randn(rows, width, generator=g,
                                                                                 dtype=torch.float64)


def reference(workers, steps=STEPS):
    """Parameters after ``steps`` SGD steps on every rank's batch at once (the mean of their losses)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        loss = sum(nn.functional.mse_loss(net(x), y) for x, y in (batch(r, step) for r in range(workers))) / workers
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _train(net, rank, steps=STEPS):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def _full(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _error(net, workers):
    ref = reference(workers)
    return max((_full(p).detach() - r).abs().max().item() for p, r in zip(net.parameters(), ref))


def _ddp(rank, workers):
    """DDP on the world: max |parameter - reference| after STEPS steps."""
    net = nn.parallel.DistributedDataParallel(model())
    _train(net, rank)
    return _error(net.module, workers)


def _fsdp(rank, workers, mesh_from_group=False):
    """FSDP2 (fully_shard per layer and at the top) on the world's default mesh, or one made
    with DeviceMesh.from_group: max |parameter - reference|."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu") if mesh_from_group else None
    net = model()
    for layer in net:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    _train(net, rank)
    return _error(net, workers)


def _hsdp(rank, workers):
    """A 2-D mesh (replicate x shard, 2 x workers/2) on gradsync subgroups: HSDP's parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, workers // 2), mesh_dim_names=("replicate", "shard"))
    backends = [dist.get_backend(mesh.get_group(d)) for d in ("replicate", "shard")]
    net = model()
    for layer in net:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    _train(net, rank)
    return {"error": _error(net, workers), "backends": backends}


def everything(rank, workers, victim):
    """One launch for the default tests: the collectives against Gloo with exact algorithms,
    then with "auto" (measured, cached), DDP, FSDP2 on the default mesh and on one made from
    the group; what the flight recorder saw; at last ``victim`` dies and the others say who."""
    from gradsync.runtime.flight import RECORDER

    gradsync_world(rank, workers, **EXACT)
    out = {"exact": compare_with_gloo(rank, workers)}
    out["recorded"] = sorted({e["algorithm"] for e in RECORDER.entries()})
    out["traced"] = _traced(rank, workers)
    configure(**{k: None for k in EXACT})
    started = time.monotonic()
    out["auto"] = compare_with_gloo(rank, workers)
    out["auto_seconds"] = time.monotonic() - started
    out["table"] = gradsync.distributed.table(dist.group.WORLD)
    out["verdicts"] = sorted({row["collective"] for row in out["table"]})
    out["choices"] = [(row["collective"], row["bytes"], row["choice"]) for row in out["table"]]
    configure(**EXACT)
    out["ddp"] = _ddp(rank, workers)
    out["fsdp"] = _fsdp(rank, workers, False)
    out["fsdp_from_group"] = _fsdp(rank, workers, True)
    out["killed"] = _killed(rank, victim)
    return out


def _traced(rank, workers):
    """An all-reduce and a reduce-scatter with a trace set: the trace's text."""
    import json

    from gradsync.runtime.tracing import Trace

    record = Trace()
    gradsync.distributed.trace(record)
    try:
        dist.all_reduce(torch.ones(64))
        dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * workers))
    finally:
        gradsync.distributed.trace(None)
    return json.dumps(record.to_dict())


def subgroups_and_hsdp(rank, workers):
    """new_group subgroups, then HSDP on a 2-D mesh, in one launch of 4 ranks."""
    out = subgroups(rank, workers)
    out["hsdp"] = _hsdp(rank, workers)
    configure(transport="gloo")            # the same collectives through the engine's send and receive
    out["over_gloo"] = compare_with_gloo(rank, workers)
    configure(transport="auto", **{k: "one_host" for k in ("all_reduce", "reduce_scatter", "all_gather",
                                                              "broadcast", "barrier")})
    out["one_host"] = compare_with_gloo(rank, workers)     # the shared-buffer collectives
    out["hsdp_one_host"] = _hsdp(rank, workers)
    return out


def subgroups(rank, workers):
    """new_group on the gradsync world: the even ranks' sum, the odd ranks' reduce-scatter."""
    gradsync_world(rank, workers, **EXACT)
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    t = torch.full((6,), float(rank))
    dist.all_reduce(t, group=mine)
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, torch.arange(6.0) + rank, group=mine)
    return {"sum": t.tolist(), "rs": out.tolist(), "backend": dist.get_backend(mine),
            "size": dist.get_world_size(mine)}


def _killed(rank, victim):
    """``victim`` dies after an all-reduce; the others wait on the next one's Work, run by the
    engine, then by a schedule."""
    t = torch.ones(1 << 14)
    dist.all_reduce(t)
    if rank == victim:
        os._exit(1)
    out = {}
    for choice in ("engine", "ring"):      # the engine's failure, then a schedule's on the same group
        configure(all_reduce=choice)
        started = time.monotonic()
        try:
            dist.all_reduce(t, async_op=True).wait()
            out[choice] = "no error"
        except dist.DistBackendError as exc:
            out[choice] = {"type": type(exc).__name__, "message": str(exc), "peer": getattr(exc, "peer", None),
                           "seconds": time.monotonic() - started}
    return out


def two_emulated_hosts(rank, workers):
    """The ranks say they run on two hosts of workers / 2 (GRADSYNC_HOST): what ``auto`` takes
    as candidates there, and the hierarchical all-reduce, reduce-scatter and all-gather through
    the backend against Gloo's on the same data (max |difference|)."""
    os.environ["GRADSYNC_HOST"] = f"machine{rank // (workers // 2)}"
    gradsync_world(rank, workers, all_reduce="hierarchical", reduce_scatter="hierarchical",
                   all_gather="hierarchical")
    gloo = dist.new_group(backend="gloo")
    group = dist.group.WORLD
    from gradsync.runtime.transport.hosts import host_map

    local = host_map(group).local_size()
    from gradsync.runtime import choice

    names = choice.candidates(group.communicator(), "all_reduce")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(workers * 1000, dtype=torch.float64, generator=g)
    diffs = {}
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        outs = []
        for on in (group, gloo):
            if kind == "all_reduce":
                out = x.clone()
                dist.all_reduce(out, group=on)
            elif kind == "reduce_scatter":
                out = torch.empty(1000, dtype=torch.float64)
                dist.reduce_scatter_tensor(out, x, group=on)
            else:
                out = torch.empty(workers * 1000, dtype=torch.float64)
                dist.all_gather_into_tensor(out, x[:1000].contiguous(), group=on)
            outs.append(out)
        diffs[kind] = (outs[0] - outs[1]).abs().max().item()
    return {"local": local, "candidates": names, "over": group.communicator().schedule_transport(), "diffs": diffs}


def call_path(rank, workers):
    """The gradsync modules one repeated ``dist.all_reduce`` passes through (hot path: after its
    first call), recorded by a profile hook in every thread; and the same for ``gradsync.all_reduce``."""
    import sys
    import threading

    import gradsync

    gradsync_world(rank, workers)
    out = {}
    for name, call in (("backend", lambda t: dist.all_reduce(t)),
                       ("front door", lambda t: gradsync.all_reduce(t, algorithm="auto"))):
        t = torch.ones(1024)
        for _ in range(3):
            call(t)
        seen = set()

        def hook(frame, event, arg):
            if event in ("call", "c_call"):
                path = frame.f_code.co_filename
                if "/gradsync/" in path:
                    seen.add(path.split("/gradsync/", 1)[1])

        dist.barrier()
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            call(t)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        out[name] = sorted(seen)
    return out


def where_large_calls_run(rank, workers):
    """A blocking 1 MiB all_reduce, then the same with async_op=True: (whether the group's
    progress thread had started after each, the results' worst error against the exact sum)."""
    gradsync_world(rank, workers)
    comm = dist.distributed_c10d._get_default_group().communicator()
    t = torch.full((1 << 18,), float(rank + 1))
    dist.all_reduce(t)
    after_blocking = comm.progress.thread is not None
    u = torch.full((1 << 18,), float(rank + 1))
    dist.all_reduce(u, async_op=True).wait()
    exact = workers * (workers + 1) / 2
    return after_blocking, comm.progress.thread is not None, float(max((t - exact).abs().max(), (u - exact).abs().max()))


def failing_hook_under_ddp(rank, workers):
    """DDP whose comm hook hands back gradsync's future of a failed collective (a peer's
    failure, made here without one): backward must raise, with the failure's words, in C++
    terms. A future that carried the error as its value crashed DDP's reducer (SIGSEGV) or
    reached it as "Unable to cast ... to Tensor"."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradsync.distributed.work import RankFailure, failed
    from gradsync.runtime.pending import Done, Queued

    out = {}
    for name, make in (("done", lambda b: failed(RankFailure("rank 9 died", peer=9), [b.buffer()]).get_future()),
                       ("queued", lambda b: _queued_failure(Queued)),
                       ("backend work", lambda b: _work_of(Done(None, RankFailure("rank 9 died", peer=9)), b))):
        model = DDP(nn.Linear(4, 4))
        model.register_comm_hook(None, lambda state, bucket, make=make: make(bucket))
        try:
            model(torch.ones(2, 4)).sum().backward()
            out[name] = "no error"
        except RuntimeError as exc:
            out[name] = str(exc)
    return out


def _queued_failure(queued):
    import threading

    from gradsync.distributed.work import RankFailure

    inner = torch.futures.Future()
    future = queued(inner).future()
    threading.Timer(0.05, lambda: inner.set_exception(RankFailure("rank 9 died", peer=9))).start()
    return future


def _work_of(pending, bucket):
    from gradsync.distributed.work import Work

    return Work(pending, [bucket.buffer()]).get_future()


def recover_after_a_death(rank, workers, victim):
    """A gradsync world of ``workers`` loses ``victim``; the survivors catch the failure, abort
    the group, destroy it, and form a new gradsync group of themselves on a new store prefix
    (torchft's reconfiguration), which sums exactly; then what is left of the first: gradsync
    segments still mapped, gradsync threads still running."""
    import threading

    store = gradsync_world(rank, workers, timeout=10.0)
    t = torch.ones(1 << 12)
    dist.all_reduce(t)                                     # the shared memory is set up and in use
    if rank == victim:
        os._exit(1)
    out = {}
    try:
        dist.all_reduce(t)
        out["failure"] = None
    except dist.DistBackendError as exc:
        out["failure"] = {"type": type(exc).__name__, "peer": getattr(exc, "peer", None)}
    dist.group.WORLD.abort()
    dist.destroy_process_group()
    survivors = [r for r in range(workers) if r != victim]
    dist.init_process_group("gradsync", store=dist.PrefixStore("reconfigured", store), rank=survivors.index(rank),
                            world_size=len(survivors), timeout=datetime.timedelta(seconds=10))
    x = torch.full((1 << 12,), float(rank))
    dist.all_reduce(x)
    out["sum"] = float(x[0])
    out["want"] = float(sum(survivors))
    dist.destroy_process_group()
    with open("/proc/self/maps") as f:
        out["mapped"] = sum(1 for line in f if "/dev/shm/gradsync-" in line)
    out["threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("gradsync"))
    return out


def monitored(rank, workers, late):
    """gradsync.distributed.monitored_barrier: every rank passes it; then ``late`` skips one and
    rank 0 must name it."""
    gradsync_world(rank, workers, timeout=20.0)
    gradsync.distributed.monitored_barrier()
    if rank == late:
        time.sleep(6)
        return {"passed": True}
    try:
        gradsync.distributed.monitored_barrier(timeout=datetime.timedelta(seconds=2))
        return {"passed": True}
    except RuntimeError as exc:
        return {"passed": False, "message": str(exc)}


def across_a_cut_link(rank, workers):
    """All-reduces on a gradsync world of two emulated machines until the second machine's link
    is cut (by the test, from outside): what each rank raised, when, and whom it named."""
    gradsync_world(rank, workers, timeout=8.0)
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    open(os.path.join(os.environ["GRADSYNC_TEST_READY"], str(rank)), "w").close()    # the test cuts now
    started = time.monotonic()
    try:
        while time.monotonic() - started < 60:
            dist.all_reduce(t)
            time.sleep(0.01)
        return {"raised": None}
    except Exception as exc:
        return {"raised": type(exc).__name__, "peer": getattr(exc, "peer", None), "message": str(exc)[:400],
                "seconds": time.monotonic() - started}
