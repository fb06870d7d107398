"""Hierarchical against flat all-reduce across emulated machines.

Each machine is a network namespace holding ``--per-node`` worker processes (they talk to each
other inside it, as processes on one host do); machines reach each other through veth pairs
shaped to ``--bandwidth`` (tc tbf, both directions) on one bridge. The workers learn the
grouping as under torchrun, from LOCAL_WORLD_SIZE. Per launch, these run interleaved on the
same gradient: gradsync's flat ring and hierarchical all-reduce over Gloo, Gloo's own
all_reduce, and the ring and hierarchical all-reduce over the mixed transport (shared memory
between the ranks of one machine, Gloo across: ``transport="auto"``, each namespace a host);
medians per launch, then the median over launches. Rows of other layouts already in ``--out``
are kept. The simulator's prediction
for the same layout (lowbw-cluster with M servers of L GPUs, the same network link) is
printed beside.

Usage (root): python benchmarks/hierarchical.py [--machines 2 4] [--per-node 2] [--launches 3]
              [--bandwidth 1Gbit] [--mb 64] [--out docs/results/hierarchical_results.json]
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gradsync
from gradsync import algorithms
from gradsync.model.cost import default_options
from gradsync.tools.launch import run
from gradsync.runtime.transport import for_group
from gradsync.tools.links import SlowLinks
from gradsync.model.simulate import simulate
from gradsync.model.topology.presets import lowbw_cluster

METHODS = ("ring", "hierarchical", "native", "ring_mixed", "hierarchical_mixed")


def interleaved(rank, workers, elements, iters):
    torch.set_num_threads(1)
    grad = torch.randn(elements, generator=torch.Generator().manual_seed(rank))
    chosen = type(for_group("auto")).__name__
    assert chosen == "MixedTransport", f"auto chose {chosen}: the namespaces are not seen as hosts"
    exact = grad.double()
    dist.all_reduce(exact)
    times = {m: [] for m in METHODS}
    worst = 0.0
    for i in range(iters + 1):                       # the first pass warms connections up
        for method in METHODS:
            buf = grad.clone()
            dist.barrier()
            start = time.perf_counter()
            if method == "native":
                dist.all_reduce(buf)
            elif method.endswith("_mixed"):
                gradsync.all_reduce(buf, algorithm=method.removesuffix("_mixed"), transport="auto")
            else:
                gradsync.all_reduce(buf, algorithm=method)
            if i:
                times[method].append(time.perf_counter() - start)
            worst = max(worst, float(((buf.double() - exact).abs().max() / exact.abs().max())))
    out = torch.tensor([statistics.median(times[m]) for m in METHODS] + [worst], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out.tolist() if rank == 0 else None


def predicted(machines, per_node, nbytes, bandwidth):
    topo = lowbw_cluster(machines, per_node, nic=bandwidth)
    n = machines * per_node
    return {name: simulate(algorithms.build(name, n, nbytes // 4, **default_options(name, topo, n)), topo).time
            for name in ("ring", "hierarchical")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--bandwidth", default="1Gbit")
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("docs/results/hierarchical_results.json"))
    args = parser.parse_args()
    nbytes = args.mb * 2 ** 20
    rows = []
    for machines in args.machines:
        workers = machines * args.per_node
        launches = []
        for _ in range(args.launches):
            with SlowLinks(workers, args.bandwidth, per_node=args.per_node) as net:
                launches.append(run(interleaved, workers, nbytes // 4, args.iters, network=net, timeout=3600)[0])
            print(machines, launches[-1], flush=True)
        med = {m: statistics.median(l[k] for l in launches) for k, m in enumerate(METHODS)}
        busbw = {m: nbytes * 2 * (workers - 1) / workers / med[m] / 1e9 for m in METHODS}
        pred = predicted(machines, args.per_node, nbytes, args.bandwidth)
        rows.append({"machines": machines, "per_node": args.per_node, "workers": workers, "bytes": nbytes,
                     "bandwidth": args.bandwidth, "launches": launches, "median_s": med, "busbw_GBps": busbw,
                     "hierarchical_over_ring": med["ring"] / med["hierarchical"],
                     "hierarchical_over_native": med["native"] / med["hierarchical"],
                     "hierarchical_mixed_over_ring": med["ring"] / med["hierarchical_mixed"],
                     "hierarchical_mixed_over_native": med["native"] / med["hierarchical_mixed"],
                     "predicted_s": pred,
                     "prediction_error": {m: pred[m] / med[m] - 1 for m in pred},
                     "worst_relative_error": max(l[-1] for l in launches)})
        print(json.dumps(rows[-1], indent=1), flush=True)
    layout = lambda r: (r["machines"], r["per_node"], r["bytes"], r["bandwidth"])     # noqa: E731
    new = {layout(r) for r in rows}
    kept = [r for r in json.loads(args.out.read_text()) if layout(r) not in new] if args.out.exists() else []
    args.out.write_text(json.dumps(sorted(kept + rows, key=layout), indent=1))
    print(f"{'machines x per node':<20} {'ring':>9} {'hier.':>9} {'native':>9} {'ring mx':>9} {'hier. mx':>9}  "
          f"hier/ring  hier mx/ring  predicted err (ring, hier)")
    for r in rows:
        m = r["median_s"]
        print(f"{r['machines']} x {r['per_node']:<16} {m['ring']:9.3f} {m['hierarchical']:9.3f} {m['native']:9.3f} "
              f"{m['ring_mixed']:9.3f} {m['hierarchical_mixed']:9.3f}  {r['hierarchical_over_ring']:9.2f}  "
              f"{r['hierarchical_mixed_over_ring']:12.2f}  "
              f"{r['prediction_error']['ring']:+.0%}, {r['prediction_error']['hierarchical']:+.0%}")


if __name__ == "__main__":
    main()
