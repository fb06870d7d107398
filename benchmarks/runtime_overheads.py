"""Three per-collective costs found in the runtime at 4 KB, each measured against its fix.

Usage: python benchmarks/runtime_overheads.py [--workers 2] [--launches 5] [--out docs/results/runtime_overheads.json]

On a 2-core machine a fresh process group settles, launch after launch, into a fast or a
slow state (the same code: 0.8 ms or 4-5 ms per 4 KB all-reduce; cause not pinned down), so each
variant runs in ``--launches`` separate process groups, alternating with its baseline, and the
figure is the median over launches of each launch's median time per call.

- agreement: the 16-byte digest exchange before every collective, as Gloo's all_gather
  against gradsync's point-to-point gather;
- openmp: a ring all-reduce after a small torch op (torch.equal of 16 bytes, as the
  agreement did), with OMP_NUM_THREADS=1 (now the local launcher's default, as torchrun's)
  against 2 (the cores here, OpenMP's default);
- work_release: the ring all-reduce with Gloo's send/receive objects kept until 32 later
  operations replace them, against freed as soon as they complete.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

CALLS = 300
ELEMENTS = 1024          # 4 KB of float32


def _median_us(fn, calls=CALLS) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def agreement(rank, workers):
    from gradsync.runtime.transport import TorchTransport

    torch.set_num_threads(1)
    digest = torch.zeros(16, dtype=torch.uint8)
    out = [torch.empty_like(digest) for _ in range(workers)]
    return {"gloo_all_gather": _median_us(lambda: dist.all_gather(out, digest)),
            "point_to_point": _median_us(lambda: TorchTransport().gather(digest, time.monotonic() + 60))}


def ring_after_torch_op(rank, workers):
    import gradsync

    torch.set_num_threads(1)
    x, a, b = torch.ones(ELEMENTS), torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)

    def step():
        torch.equal(a, b)
        gradsync.all_reduce(x)
    return {"ring": _median_us(step), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def ring_release(rank, workers, keep):
    import gradsync
    from gradsync.runtime.transport import distributed as transport   # where the kept Work objects live

    torch.set_num_threads(1)
    if not keep:
        transport._recent = transport.deque(maxlen=0)
    x = torch.ones(ELEMENTS)
    return {"ring": _median_us(lambda: gradsync.all_reduce(x))}


def _launch(fn, workers, *args, omp=None):
    from gradsync.tools.launch import run

    old = os.environ.get("OMP_NUM_THREADS")
    if omp is not None:
        os.environ["OMP_NUM_THREADS"] = omp
    try:
        return run(fn, workers, *args)[0]
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--out", default="docs/results/runtime_overheads.json")
    args = parser.parse_args()
    n = args.workers
    runs = {key: [] for key in ("agreement", "openmp_1", "openmp_2", "release_kept", "release_at_once")}
    for i in range(args.launches):
        runs["agreement"].append(_launch(agreement, n))
        runs["openmp_1"].append(_launch(ring_after_torch_op, n, omp="1")["ring"])
        runs["openmp_2"].append(_launch(ring_after_torch_op, n, omp="2")["ring"])
        runs["release_kept"].append(_launch(ring_release, n, True)["ring"])
        runs["release_at_once"].append(_launch(ring_release, n, False)["ring"])
        print(f"launch {i + 1}/{args.launches}", flush=True)

    def med(values):
        return statistics.median(values)

    summary = {
        "workers": n, "launches": args.launches, "calls_per_launch": CALLS, "bytes": ELEMENTS * 4,
        "agreement_us": {"gloo_all_gather": med([r["gloo_all_gather"] for r in runs["agreement"]]),
                         "point_to_point": med([r["point_to_point"] for r in runs["agreement"]])},
        "ring_after_torch_op_us": {"omp_1": med(runs["openmp_1"]), "omp_2": med(runs["openmp_2"])},
        "ring_us": {"works_kept": med(runs["release_kept"]), "works_freed_at_once": med(runs["release_at_once"])},
        "per_launch": runs,
    }
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_launch"}, indent=1))


if __name__ == "__main__":
    main()
