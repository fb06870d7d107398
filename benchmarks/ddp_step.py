"""A DDP training step with gradsync's hooks against DDP's own all-reduce.

Usage: python benchmarks/ddp_step.py [--workers 4] [--launches 3] [--steps 20] [--out FILE]

Each launch starts --workers local processes (Gloo over loopback). Every worker builds three
replicas of one MLP (8 layers of 1024 x 1024, 32 MB of gradients, DDP buckets of 4 MB: 9
buckets), one wrapped with DDP's built-in all-reduce, one with ``comm_hook("ring")`` (over
Gloo), one with ``comm_hook("auto")`` (over Gloo) and one with ``comm_hook("auto",
transport="auto")`` ("shm_auto": on one host, the shared-buffer all-reduce, by reads), and one
with no synchronization at all ("none": what the step costs without it). They take turns in blocks of --steps steps (forward, backward,
SGD step), the first block of each untimed; the step time is the median over blocks. Printed
and written: each launch's medians and ratios against DDP, and the median ratio over launches.
"""

import argparse
import json
import statistics
import sys

import torch
from common import step_times

VARIANTS = ("ddp", "ring", "auto", "shm_auto", "none")


def _no_sync(state, bucket):
    """A DDP hook that hands the local gradient back unsummed: the step without synchronization."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def worker(rank, workers, steps, blocks):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gradsync.torch import comm_hook

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    base = torch.nn.Sequential(*layers)
    models = {}
    for name in VARIANTS:
        replica = torch.nn.Sequential(*[type(m)(1024, 1024) if isinstance(m, torch.nn.Linear) else m for m in base])
        replica.load_state_dict(base.state_dict())
        ddp = DistributedDataParallel(replica, bucket_cap_mb=4)
        if name == "shm_auto":
            ddp.register_comm_hook(None, comm_hook("auto", transport="auto"))
        elif name == "none":
            ddp.register_comm_hook(None, _no_sync)
        elif name != "ddp":
            ddp.register_comm_hook(None, comm_hook(name))
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    x = torch.randn(32, 1024)

    def step(name):
        ddp, opt = models[name]
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()

    seconds = step_times(step, VARIANTS, steps, blocks, dist.barrier)
    spread = max(float((p - q).abs().max()) for other in ("ring", "shm_auto")
                 for p, q in zip(models["ddp"][0].parameters(), models[other][0].parameters()))
    return {"step_s": seconds, "ring_vs_ddp_max_param_diff": spread}


def main():
    from gradsync.tools.launch import run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    launches = []
    for launch in range(args.launches):
        r = run(worker, args.workers, args.steps, args.blocks, timeout=1200)[0]
        r["ratio"] = {n: r["step_s"][n] / r["step_s"]["ddp"] for n in VARIANTS}
        launches.append(r)
        print(f"launch {launch}: " + ", ".join(f"{n} {r['step_s'][n] * 1e3:.1f} ms ({r['ratio'][n]:.3f})"
                                               for n in VARIANTS) + f"; ring vs ddp parameters differ by {r['ring_vs_ddp_max_param_diff']:.2g}",
              flush=True)
    summary = {n: statistics.median(r["ratio"][n] for r in launches) for n in VARIANTS}
    print("median ratio to DDP over launches: " + ", ".join(f"{n} {v:.3f}" for n, v in summary.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"workers": args.workers, "launches": launches, "median_ratio": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
