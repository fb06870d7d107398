"""The gradsync backend's ``auto`` against the engine's own collective, size by size.

Usage: python benchmarks/backend_auto.py [--workers 2,4] [--launches 3]
       [--sizes 4KiB,64KiB,1MiB,16MiB,64MiB,256MiB] [--out FILE]

``auto`` promises never to be slower than the engine it sits on: the engine (Gloo on CPU) is
one of its candidates, and a schedule is kept at a size only where it measured at most 0.95 of
the engine's time (``gradsync.runtime.choice``). This checks the promise as a user meets it.
Each launch starts --workers local processes with two groups over all of them, one on Gloo
(``new_group(backend="gloo")``) and one on gradsync with every collective on "auto". For each
size and collective (all_reduce, reduce_scatter_tensor, all_gather_into_tensor of float32; the
size is the whole tensor) the two groups take turns call by call, a barrier before each, after
two untimed calls each (the first of which is where ``auto`` measures, on a group's first use);
a launch's time is the slowest rank's median. The figure per row is the median over launches
of auto / Gloo. A second Gloo group takes its turn too, as a control: its ratio to the first
(the same collective on the same engine) is what the machine's noise alone gives. Every launch shares one fresh verdict cache, as jobs on one host do: the first
launch measures, the later ones read its verdicts. What ``auto`` chose is printed beside each
row (the group's communicator's verdicts, ``gradsync.distributed.table``).
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


def worker(rank, workers, sizes):
    import torch.distributed as dist

    import gradsync.distributed

    torch.set_num_threads(1)
    gradsync.distributed.register()
    gradsync.distributed.configure(all_reduce="auto", reduce_scatter="auto", all_gather="auto", transport="auto")
    groups = {"gloo": dist.new_group(backend="gloo"), "auto": dist.new_group(backend="gradsync"),
              "gloo_again": dist.new_group(backend="gloo")}
    first_use = {}
    out = {}
    for nbytes in sizes:
        full = torch.ones(max(nbytes // 4 // workers, 1) * workers)
        part = torch.ones(full.numel() // workers)
        calls = {
            "all_reduce": lambda g: dist.all_reduce(full, group=g),
            "reduce_scatter": lambda g: dist.reduce_scatter_tensor(part, full, group=g),
            "all_gather": lambda g: dist.all_gather_into_tensor(full, part, group=g)}
        reps = 25 if nbytes <= (1 << 20) else (5 if nbytes <= (16 << 20) else 3)
        for kind in KINDS:
            call = calls[kind]
            for name, group in groups.items():
                start = time.perf_counter()
                call(group)                       # auto measures here, at the group's first use
                first_use.setdefault(f"{name} {kind}", time.perf_counter() - start)
                call(group)
            times = {name: [] for name in groups}
            for _ in range(reps):
                for name, group in groups.items():
                    dist.barrier(group=groups["gloo"])
                    start = time.perf_counter()
                    call(group)
                    times[name].append(time.perf_counter() - start)
            out[f"{nbytes} {kind}"] = {name: statistics.median(t) for name, t in times.items()}
    verdicts = groups["auto"].communicator().verdicts
    chosen = {f"{nbytes} {kind}": verdicts[kind].pick(nbytes) if kind in verdicts else "engine"
              for nbytes in sizes for kind in KINDS}
    return {"times": out, "choices": gradsync.distributed.table(groups["auto"]), "chosen": chosen,
            "first_use": first_use}


def main(argv=None):
    from gradsync.tools.launch import run
    from gradsync.units import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB,256MiB")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    cache = Path(tempfile.mkdtemp(prefix="gradsync-auto-")) / "verdicts.json"
    os.environ["GRADSYNC_AUTO_CACHE"] = str(cache)          # the workers inherit it: one host's cache
    result = {"sizes": sizes, "launches": args.launches, "per_workers": {}}
    for workers in (int(w) for w in args.workers.split(",")):
        launches = []
        for i in range(args.launches):
            per_rank = run(worker, workers, sizes, timeout=900.0)
            times = {row: {name: max(r["times"][row][name] for r in per_rank) for name in ("gloo", "auto", "gloo_again")}
                     for row in per_rank[0]["times"]}
            launches.append({"times": times, "choices": per_rank[0]["choices"], "chosen": per_rank[0]["chosen"],
                             "first_use": per_rank[0]["first_use"]})
            print(f"N = {workers}, launch {i}: " + ", ".join(
                f"{row} {t['auto'] / t['gloo']:.2f}x" for row, t in times.items()), flush=True)
        rows = {}
        for row in launches[0]["times"]:
            ratios = [x["times"][row]["auto"] / x["times"][row]["gloo"] for x in launches]
            same = [x["times"][row]["gloo_again"] / x["times"][row]["gloo"] for x in launches]
            rows[row] = {"gloo_s": statistics.median(x["times"][row]["gloo"] for x in launches),
                         "auto_s": statistics.median(x["times"][row]["auto"] for x in launches),
                         "ratios": ratios, "median_ratio": statistics.median(ratios),
                         "gloo_again_ratios": same, "median_gloo_again_ratio": statistics.median(same)}
        result["per_workers"][str(workers)] = {"rows": rows, "launches": launches}
        print(f"\nN = {workers}: auto / Gloo, median over {args.launches} launches "
              f"(choices as the last launch's auto had them)")
        for row, r in rows.items():
            nbytes, kind = row.split()
            choice = launches[-1]["chosen"][row]
            print(f"  {format_size(int(nbytes)):>8} {kind:15s} Gloo {r['gloo_s'] * 1e3:9.3f} ms  "
                  f"auto {r['auto_s'] * 1e3:9.3f} ms  {r['median_ratio']:.2f}x  ({choice});  "
                  f"Gloo again {r['median_gloo_again_ratio']:.2f}x")
    worst = max(r["median_ratio"] for w in result["per_workers"].values() for r in w["rows"].values())
    same = [r["median_gloo_again_ratio"] for w in result["per_workers"].values() for r in w["rows"].values()]
    result["worst_median_ratio"], result["gloo_again_range"] = worst, [min(same), max(same)]
    print(f"\nworst median auto / Gloo over every row: {worst:.2f}x; the same Gloo collective on a second "
          f"Gloo group: {min(same):.2f}x to {max(same):.2f}x (what this machine can resolve)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
