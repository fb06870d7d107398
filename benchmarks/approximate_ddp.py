"""Approximate gradient sync under an unchanged DDP script, across emulated machines: step time
and time to a stated test accuracy against exact sync on Gloo.

Usage: python benchmarks/approximate_ddp.py [--machines 2] [--workers 4] [--link-bandwidth 100Mbit]
       [--settings exact,fp16,powersgd:rank=4,topk:ratio=0.05,cerar:components=8] [--target 0.95]
       [--max-steps 150] [--check-every 1]
       [--width 1024] [--out FILE]      (root: network namespaces and shaped links)

The task is scikit-learn's handwritten digits (it ships with the package), an MLP of two hidden
layers of --width (about 1.1 M parameters, 4.4 MB of gradient at 1024), SGD with momentum, each
worker a shard of every global batch of 64 per worker. The script is the same for every setting:
DistributedDataParallel on the default group, with ``init_process_group("gloo")`` for the
baseline and ``init_process_group("gradsync")`` with ``GRADSYNC_GRADIENTS=<setting>`` (and
"exact") otherwise; only the environment differs. Every setting runs in its own launch, in
turn, on the same links.

Per setting: the median step time (forward, backward with DDP's all-reduces, optimizer step),
the steps and seconds of training until the test accuracy first reaches --target (measured
every 5 steps, not counted in the time), and, for a setting with a bound per step (fp16, bf16,
cerar), the largest error of any step's averaged gradient against the exact average, as the
fraction of its stated bound: every --check-every steps (1: every step) the unwrapped model's
local gradient is all-reduced exactly on a Gloo group beside (not timed).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

BATCH = 64          # per worker
CHECK_EVERY = 5


def _model(width: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))


def worker(rank, workers, backend, setting, target, max_steps, width, check_every=1):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradsync.distributed import configure, gradients
    from gradsync.training.data import batches, digits

    torch.set_num_threads(1)
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    if backend == "gradsync":
        import gradsync.distributed

        gradsync.distributed.register()
        configure(gradients=setting)
    dist.init_process_group(backend, store=dist.PrefixStore(f"approx/{setting}", store), rank=rank,
                            world_size=workers)
    exact = dist.new_group(backend="gloo")
    data = digits()
    model = DDP(_model(width), bucket_cap_mb=4)
    twin = _model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    parsed = gradients.parse(setting)
    check = backend == "gradsync" and parsed.name in ("fp16", "bf16", "cerar")
    steps, seconds, trained, reached, worst = 0, [], 0.0, None, 0.0
    epoch = 0
    while steps < max_steps and reached is None:
        for batch in batches(len(data.y_train), BATCH * workers, epoch):
            mine = batch[rank * BATCH:(rank + 1) * BATCH]
            x, y = data.x_train[mine], data.y_train[mine]
            checked = check and steps % check_every == 0
            if checked:
                twin.load_state_dict(model.module.state_dict())
            dist.barrier(group=exact)
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            got = [p.grad.detach().clone() for p in model.parameters()] if checked else None
            opt.step()
            took = time.perf_counter() - start
            seconds.append(took)
            trained += took
            steps += 1
            if checked:
                worst = max(worst, _error_over_bound(twin, x, y, got, parsed, workers, exact))
            if steps % CHECK_EVERY == 0:
                with torch.no_grad():
                    accuracy = (model.module(data.x_test).argmax(1) == data.y_test).float().mean().item()
                if accuracy >= target and reached is None:
                    reached = {"steps": steps, "seconds": trained, "accuracy": accuracy}
                    break
            if steps >= max_steps:
                break
        epoch += 1
    return {"step_s": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0], "steps": steps,
            "reached": reached, "worst_over_bound": worst if check else None,
            "checked_steps": -(-steps // check_every) if check else 0}


def _error_over_bound(twin, x, y, got, setting, workers, group) -> float:
    """This step's largest error of the averaged gradient ``got`` against the exact average of
    every rank's local gradient (all-reduced in float64 on Gloo), over its stated bound."""
    import torch.distributed as dist

    from gradsync.distributed.gradients import FLOOR, ROUNDOFF

    twin.zero_grad()
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    local = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
    both = torch.cat([local, local.abs()])                  # one exact all-reduce carries both sums
    dist.all_reduce(both, group=group)
    total, magnitude = both[:local.numel()].double(), both[local.numel():].double()
    exact = total / workers
    mine = torch.cat([g.reshape(-1).double() for g in got])
    if setting.name == "cerar":
        relative = float(torch.linalg.vector_norm(mine - exact) / torch.linalg.vector_norm(exact))
        return relative / setting.design(workers).checked_error("float32")
    u, eta = ROUNDOFF[setting.name], FLOOR[setting.name]
    bound = (workers + 1) * (u * magnitude / workers + workers * eta)        # DDP hands over g_i / N
    return float(((mine - exact).abs() / bound).max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--link-bandwidth", default="100Mbit")
    parser.add_argument("--settings", default="exact,fp16,powersgd:rank=4,topk:ratio=0.05,cerar:components=8")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--check-every", type=int, default=1, help="steps between checks of the bound")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    from gradsync.distributed.gradients import parse
    from gradsync.errors import ConfigError
    from gradsync.tools.launch import run
    from gradsync.tools.links import SlowLinks

    settings = args.settings.split(";" if ";" in args.settings else ",")
    try:
        for setting in settings:                  # refused here, before any launch
            parse(setting).check(args.workers)
    except ConfigError as exc:
        parser.error(str(exc))
    rows = []
    for backend, setting in [("gloo", "exact")] + [("gradsync", s) for s in settings]:
        # a cache of its own per launch: auto decides on this link, not on a verdict another run cached
        os.environ["GRADSYNC_AUTO_CACHE"] = str(Path(tempfile.mkdtemp(prefix="gradsync-auto-")) / "auto.json")
        with SlowLinks(args.workers, args.link_bandwidth, per_node=args.workers // args.machines) as net:
            per_rank = run(worker, args.workers, backend, setting, args.target, args.max_steps, args.width,
                           args.check_every, network=net, timeout=600.0)
        r = per_rank[0]
        row = {"backend": backend, "gradients": setting, "step_s": max(p["step_s"] for p in per_rank),
               "steps": r["steps"], "reached": r["reached"],
               "worst_over_bound": None if r["worst_over_bound"] is None else
               max(p["worst_over_bound"] for p in per_rank)}
        rows.append(row)
        reached = row["reached"]
        print(f"{backend:8s} {setting:22s} step {row['step_s'] * 1e3:8.1f} ms  "
              + (f"accuracy {reached['accuracy']:.3f} after {reached['steps']} steps, {reached['seconds']:.2f} s"
                 if reached else f"target not reached in {row['steps']} steps")
              + ("" if row["worst_over_bound"] is None else f"  worst error / bound {row['worst_over_bound']:.3f}"),
              flush=True)
    base = rows[0]
    for row in rows:
        row["step_ratio"] = row["step_s"] / base["step_s"]
        if row["reached"] and base["reached"]:
            row["time_to_target_ratio"] = row["reached"]["seconds"] / base["reached"]["seconds"]
    result = {"machines": args.machines, "workers": args.workers, "link_bandwidth": args.link_bandwidth,
              "target": args.target, "width": args.width, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
