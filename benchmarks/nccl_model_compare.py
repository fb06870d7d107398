"""gradsync's simulation of NCCL's algorithms against NCCL's own cost model, on rail clusters.

For 1 GB on rail clusters of 8-GPU H100 machines (``cluster:machines=M,gpu=h100``: 8 x 400
Gbit/s NICs per machine, NVLink SHARP), each of NCCL's all-reduce algorithms at its fastest
protocol, as gradsync simulates it and as NCCL's tuner predicts it (``model/nccl.py``, its
``System.of`` the cluster). Each row a fresh simulation; CPU time and peak memory of the process
are measured by the caller (``/usr/bin/time``) where the figure is the CLI's.

    python benchmarks/nccl_model_compare.py --workers 1024,16384,65536 --out docs/results/nccl_model_compare.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from gradsync import algorithms
from gradsync.algorithms import _compact
from gradsync.model import nccl
from gradsync.model.cost import predict
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset

PAIRS = {"nccl_ring": "ring", "nccl_tree": "tree", "nvls_tree": "nvls_tree"}
TABLE_UP_TO = 64       # workers: a schedule without a compact form is simulated as a table up to here (as tune)


def row(algorithm: str, workers: int, nbytes: int) -> dict:
    topo = preset("cluster", machines=workers // 8, gpu="h100")
    system = nccl.System.of(topo)
    theirs = min((nccl.time(PAIRS[algorithm], p, nbytes, system), p) for p in nccl.PROTOCOLS)
    out = {"algorithm": algorithm, "workers": workers, "bytes": nbytes, "nccl_s": theirs[0], "nccl_protocol": theirs[1],
           "nccl_latency_us": nccl.latency(PAIRS[algorithm], theirs[1], system),
           "nccl_bandwidth_GBps": nccl.bandwidth(PAIRS[algorithm], theirs[1], system)}
    start, cpu = time.perf_counter(), time.process_time()
    schedule = _compact.build(algorithm, workers, nbytes // 4, local_size=8)
    if schedule is None and workers > TABLE_UP_TO:       # no symmetry to use: gradsync's closed form
        closed = min((predict(algorithm, topo, workers, nbytes, 4, p, local_size=8), p) for p in nccl.PROTOCOLS)
        out.update(gradsync_s=closed[0], gradsync_protocol=closed[1], gradsync_by="closed form",
                   ratio=closed[0] / theirs[0])
        return out
    schedule = schedule or algorithms.build(algorithm, workers, nbytes // 4, local_size=8)
    result = min((simulate(schedule, topo, protocol=p) for p in nccl.PROTOCOLS
                  if p == "simple" or algorithm not in ("nvls_tree",)), key=lambda r: r.time)
    out.update(gradsync_s=result.time, gradsync_protocol=result.protocol, gradsync_by="simulator",
               wall_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu,
               peak_rss_MB=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, ratio=result.time / theirs[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1024,16384,65536")
    ap.add_argument("--algorithms", default="nccl_ring,nccl_tree,nvls_tree")
    ap.add_argument("--size", type=int, default=10**9)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for n in map(int, args.workers.split(",")):
        for a in args.algorithms.split(","):
            r = row(a, n, args.size)
            rows.append(r)
            print(json.dumps(r))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
