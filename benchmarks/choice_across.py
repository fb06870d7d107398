"""What ``auto`` chooses across machines at the sizes DDP and FSDP2 send, beside every candidate
measured there: is the choice the fastest?

Usage: python benchmarks/choice_across.py [--machines 2] [--workers 4] [--link-bandwidth 1Gbit]
       [--sizes-kb 1024,2048,4100,8200,16400] [--reps 7] [--out FILE]       (root: emulated machines)

The workers run on --machines emulated machines (network namespaces joined by links shaped to
--link-bandwidth, ``gradsync.tools.links``). On a fresh cache, each rank's gradsync group
first decides (``choice.choose``: the first decision per collective, timed), then every
candidate auto weighed, and the engine, is timed at every size (median of --reps calls, each
after a barrier, the slowest rank's), for all_reduce, reduce_scatter and all_gather. 4100 KiB
is one layer of 1024 x 1024 float32 with its bias: backend_step's DDP bucket and FSDP2's
per-layer all-gather and reduce-scatter; half of it, HSDP's replicated all-reduce of a shard.
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

KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def worker(rank, workers, sizes, reps):
    import torch.distributed as dist

    import gradsync.distributed
    from gradsync.runtime import choice

    gradsync.distributed.register()
    torch.set_num_threads(1)
    group = dist.new_group(backend="gradsync")
    comm = group.communicator()
    out = {"decided_in": {}, "rows": []}
    for kind in KINDS:
        started = time.monotonic()
        choice.choose(comm, kind, torch.float32, sizes[0])
        out["decided_in"][kind] = time.monotonic() - started
        names = sorted(set(choice.candidates(comm, kind)) | {"engine"})
        for size in sizes:
            n = size // 4 // workers * workers
            full, part = torch.ones(n), torch.ones(n // workers)
            tensors = {"all_reduce": (full,), "reduce_scatter": (part, full), "all_gather": (full, part)}[kind]
            times = {}
            for name in names:
                plan = comm._build(kind, name, torch.float32, "sum", True)
                plan.start(tensors, False)
                took = []
                for _ in range(reps):
                    comm.engine_wait(comm.engine.barrier(), "timing")
                    t0 = time.perf_counter()
                    plan.start(tensors, False)
                    took.append(time.perf_counter() - t0)
                times[name] = statistics.median(took)
            out["rows"].append({"collective": kind, "bytes": n * 4, "chosen": choice.choose(comm, kind, torch.float32,
                                                                                           n * 4), "seconds": times})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--link-bandwidth", default="1Gbit")
    parser.add_argument("--sizes-kb", default="1024,2048,4100,8200,16400")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    from gradsync.tools.launch import run
    from gradsync.tools.links import SlowLinks

    os.environ["GRADSYNC_AUTO_CACHE"] = str(Path(tempfile.mkdtemp(prefix="gradsync-auto-")) / "auto.json")
    try:
        sizes = [int(float(k) * 1024) for k in args.sizes_kb.split(",")]
    except ValueError:
        parser.error(f"--sizes-kb: expected sizes in KiB separated by commas, got {args.sizes_kb!r}")
    with SlowLinks(args.workers, args.link_bandwidth, per_node=args.workers // args.machines) as net:
        per_rank = run(worker, args.workers, sizes, args.reps, network=net, timeout=900.0)
    rows = []
    for i, row in enumerate(per_rank[0]["rows"]):
        seconds = {name: max(r["rows"][i]["seconds"][name] for r in per_rank) for name in row["seconds"]}
        best = min(seconds, key=seconds.get)
        rows.append({**row, "seconds": seconds, "best": best,
                     "chosen_over_best": seconds[row["chosen"]] / seconds[best],
                     "chosen_over_engine": seconds[row["chosen"]] / seconds["engine"]})
        print(f"{row['collective']:15s} {row['bytes'] / 1024:8.0f} KiB  chosen {row['chosen']:13s} "
              f"{seconds[row['chosen']] * 1e3:7.1f} ms  best {best:13s} {seconds[best] * 1e3:7.1f} ms  "
              f"engine {seconds['engine'] * 1e3:7.1f} ms  ({rows[-1]['chosen_over_engine']:.2f}x engine)", flush=True)
    decided = {k: max(r["decided_in"][k] for r in per_rank) for k in KINDS}
    print("first decision per collective: " + ", ".join(f"{k} {v:.2f} s" for k, v in decided.items()))
    result = {"machines": args.machines, "workers": args.workers, "link_bandwidth": args.link_bandwidth,
              "reps": args.reps, "decided_in_s": decided, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
