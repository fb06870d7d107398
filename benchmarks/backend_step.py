"""A DDP and an FSDP2 training step on the gradsync backend against the same step on Gloo.

Usage: python benchmarks/backend_step.py [--workers 4] [--launches 3] [--steps 10] [--blocks 3]
       [--width 1024] [--layers 8] [--algorithms "all_reduce=ring,..."] [--out FILE]
       python benchmarks/backend_step.py --collectives [--workers 4] [--sizes-mb 1,16]
       python benchmarks/backend_step.py --machines 2 --link-bandwidth 1Gbit [--fresh-choice]   (root: emulated machines)

``--collectives`` times single collectives instead (all_reduce, reduce_scatter_tensor,
all_gather_into_tensor of float32, median of 8 calls after 2): on the Gloo group, and on the
gradsync group as a ring over Gloo's send/recv, a ring over shared memory, and ``one_host``.

Each launch starts --workers local processes, and in each one two process groups over all of
them: one on Gloo (``new_group(backend="gloo")``) and one on gradsync
(``new_group(backend="gradsync")``, its choices from --algorithms, else "auto"). On each group
it builds the same MLP (--layers layers of --width x --width, float32) twice: wrapped in
DistributedDataParallel (4 MB buckets), and sharded with FSDP2's ``fully_shard`` per layer
and at the top (the mesh ``DeviceMesh.from_group``). The four variants take turns in blocks of
--steps steps (forward, backward, SGD step), the first block of each untimed; a launch's step
time is the median over its blocks, and the figure is the median over launches of each
launch's ratio gradsync / Gloo, side by side for DDP and FSDP2. Both groups' parameters are
compared at the end (max |difference|, to show the same training happened).

``--machines M --link-bandwidth B`` puts the workers on M emulated machines (network
namespaces, --workers / M each, joined by links shaped to B: ``gradsync.tools.links``), as
the hierarchical benchmark does; ``auto`` then weighs the hierarchical schedule too, and an
HSDP variant joins (``fully_shard`` on a 2-D mesh of each backend's subgroups: replicas across
the machines, shards inside each). ``--fresh-choice`` gives every launch a cache of its own,
so that ``auto`` measures anew in each (its decisions then vary as its measurements do).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from common import step_times

VARIANTS = ("ddp_gloo", "ddp_gradsync", "fsdp_gloo", "fsdp_gradsync")
HSDP = ("hsdp_gloo", "hsdp_gradsync")      # with --machines: replicated across machines, sharded inside each


def _model(width: int, layers: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                                 for _ in range(layers)])


def _hsdp_mesh(backend: str, workers: int, machines: int):
    """A 2-D mesh on ``backend``'s subgroups: dimension 0 across the machines (the replicas),
    dimension 1 inside each machine (the shards); every rank makes every subgroup, in order."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    local, rank = workers // machines, dist.get_rank()
    mine = {}
    for j in range(local):                                    # replicate: the same local rank on every machine
        ranks = [m * local + j for m in range(machines)]
        group = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            mine["replicate"] = group
    for m in range(machines):                                 # shard: the ranks of one machine
        ranks = list(range(m * local, (m + 1) * local))
        group = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            mine["shard"] = group
    return DeviceMesh.from_group([mine["replicate"], mine["shard"]], "cpu",
                                 mesh=torch.arange(workers).view(machines, local), mesh_dim_names=("replicate", "shard"))


def _variants(groups: dict, width: int, layers: int, machines: int = 1) -> dict:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for backend, group in groups.items():
        ddp = DistributedDataParallel(_model(width, layers), process_group=group, bucket_cap_mb=4)
        out[f"ddp_{backend}"] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
        mesh = DeviceMesh.from_group(group, "cpu")
        sharded = _model(width, layers)
        for layer in sharded:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        out[f"fsdp_{backend}"] = (sharded, torch.optim.SGD(sharded.parameters(), lr=1e-3))
        if machines > 1:
            mesh2 = _hsdp_mesh(backend, group.size(), machines)
            hybrid = _model(width, layers)
            for layer in hybrid:
                fully_shard(layer, mesh=mesh2)
            fully_shard(hybrid, mesh=mesh2)
            out[f"hsdp_{backend}"] = (hybrid, torch.optim.SGD(hybrid.parameters(), lr=1e-3))
    return out


def worker(rank, workers, steps, blocks, width, layers, algorithms, machines=1):
    import torch.distributed as dist

    import gradsync.distributed

    if algorithms:
        os.environ["GRADSYNC_ALGORITHMS"] = algorithms
    gradsync.distributed.register()
    torch.set_num_threads(1)
    groups = {"gloo": dist.new_group(backend="gloo"), "gradsync": dist.new_group(backend="gradsync")}
    models = _variants(groups, width, layers, machines)
    variants = VARIANTS + (HSDP if machines > 1 else ())
    x = torch.randn(32, width, generator=torch.Generator().manual_seed(rank))

    def step(name):
        net, opt = models[name]
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()

    seconds = step_times(step, variants, steps, blocks, dist.barrier)
    import gradsync.distributed

    return {"seconds": seconds, "same": _same(models), "auto": gradsync.distributed.table(groups["gradsync"])}


SETUPS = {"gloo": None, "ring over gloo": dict(transport="gloo"), "ring over shm": dict(transport="shm"),
          "one_host": dict(all_reduce="one_host", reduce_scatter="one_host", all_gather="one_host")}


def collectives(rank, workers, sizes_mb):
    """Median milliseconds per call of each collective, per setup and size."""
    import torch.distributed as dist

    import gradsync.distributed

    gradsync.distributed.register()
    torch.set_num_threads(1)
    gloo, ours = dist.new_group(backend="gloo"), dist.new_group(backend="gradsync")

    def median_ms(fn, reps=8):
        for _ in range(2):
            fn()
        times = []
        for _ in range(reps):
            dist.barrier(group=gloo)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    out = {}
    for mb in sizes_mb:
        full = torch.ones(int(mb * (1 << 18)) // workers * workers)
        part = torch.ones(full.numel() // workers)
        for setup, choices in SETUPS.items():
            group = gloo if choices is None else ours
            if choices is not None:
                gradsync.distributed.configure(**{"all_reduce": "ring", "reduce_scatter": "ring",
                                                  "all_gather": "ring", "transport": "auto", **choices})
            out[f"{mb} MB {setup}"] = {
                "all_reduce": median_ms(lambda: dist.all_reduce(full, group=group)),
                "reduce_scatter": median_ms(lambda: dist.reduce_scatter_tensor(part, full, group=group)),
                "all_gather": median_ms(lambda: dist.all_gather_into_tensor(full, part, group=group))}
    return out


def _same(models: dict) -> dict:
    """Max |difference| of the parameters trained on Gloo and on gradsync, for DDP and FSDP2."""
    out = {}
    for kind in ("ddp", "fsdp", "hsdp"):
        if f"{kind}_gloo" not in models:
            continue
        a, b = (models[f"{kind}_{backend}"][0] for backend in ("gloo", "gradsync"))
        full = [(p.full_tensor() if hasattr(p, "full_tensor") else p, q.full_tensor() if hasattr(q, "full_tensor")
                 else q) for p, q in zip(a.parameters(), b.parameters())]
        out[kind] = max((p - q).abs().max().item() for p, q in full)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--algorithms", default="", help="GRADSYNC_ALGORITHMS for the gradsync group")
    parser.add_argument("--out", default="")
    parser.add_argument("--collectives", action="store_true", help="time single collectives instead")
    parser.add_argument("--sizes-mb", default="1,16")
    parser.add_argument("--machines", type=int, default=1, help="emulated machines (root); 1: none")
    parser.add_argument("--link-bandwidth", default="1Gbit", help="with --machines: each machine's link")
    parser.add_argument("--fresh-choice", action="store_true",
                        help="auto measures anew in every launch (a cache of its own per launch)")
    args = parser.parse_args(argv)
    from gradsync.tools.launch import run

    if args.collectives:
        result = run(collectives, args.workers, [float(x) for x in args.sizes_mb.split(",")], timeout=600.0)[0]
        for name, row in result.items():
            print(f"{name:24s} " + "  ".join(f"{k} {v:.2f} ms" for k, v in row.items()))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return result
    launches = []
    for i in range(args.launches):
        if args.fresh_choice:
            import tempfile

            os.environ["GRADSYNC_AUTO_CACHE"] = str(Path(tempfile.mkdtemp(prefix="gradsync-auto-")) / "auto.json")
        if args.machines > 1:
            from gradsync.tools.links import SlowLinks

            with SlowLinks(args.workers, args.link_bandwidth, per_node=args.workers // args.machines) as net:
                per_rank = run(worker, args.workers, args.steps, args.blocks, args.width, args.layers,
                               args.algorithms, args.machines, network=net, timeout=1800.0)
        else:
            per_rank = run(worker, args.workers, args.steps, args.blocks, args.width, args.layers, args.algorithms,
                           timeout=600.0)
        seconds = {k: max(r["seconds"][k] for r in per_rank) for k in per_rank[0]["seconds"]}   # the slowest rank's
        launch = {"seconds": seconds, "same": per_rank[0]["same"], "auto": per_rank[0]["auto"],
                  **{f"{kind}_ratio": seconds[f"{kind}_gradsync"] / seconds[f"{kind}_gloo"]
                     for kind in ("ddp", "fsdp", "hsdp") if f"{kind}_gloo" in seconds}}
        launches.append(launch)
        print(f"launch {i}: " + "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in seconds.items())
              + "  ratio " + " ".join(f"{k[:-6]} {v:.2f}" for k, v in launch.items() if k.endswith("_ratio"))
              + f"  same {launch['same']}"
              + "  auto: " + ", ".join(f"{a['collective']} {a['bytes'] >> 10} KiB {a['choice']}" for a in launch["auto"]),
              flush=True)
    result = {"workers": args.workers, "machines": args.machines,
              "link_bandwidth": args.link_bandwidth if args.machines > 1 else None, "width": args.width, "layers": args.layers, "steps": args.steps,
              "blocks": args.blocks, "algorithms": args.algorithms or "auto", "launches": launches,
              **{f"median_{kind}_ratio": statistics.median(x[f"{kind}_ratio"] for x in launches)
                 for kind in ("ddp", "fsdp", "hsdp") if f"{kind}_ratio" in launches[0]}}
    print(f"median over {args.launches} launches, gradsync / Gloo step time: "
          + ", ".join(f"{label} {result[f'median_{kind}_ratio']:.2f}x" for kind, label in
                      (("ddp", "DDP"), ("fsdp", "FSDP2"), ("hsdp", "HSDP")) if f"median_{kind}_ratio" in result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
