"""gradsync's ring over shared memory against Gloo's all_reduce (and MPI's Allreduce), by time.

Usage: python benchmarks/shm_vs_gloo.py [--workers 2,4] [--launches 3] [--sizes 4KB,1MB,16MB,64MB]
                                        [--no-mpi] [--out docs/results/shm_results.json]

Each launch is one ``gradsync bench --algorithms ring --transport shm`` run: a fresh group of
local processes in which bench times Gloo's own all_reduce (its ``native`` row) and gradsync's
ring over shared memory in alternating blocks of back-to-back calls, on the same inputs. The
ratio per launch is Gloo's time / ring's time (above 1: shared memory is faster); printed and
recorded are each launch's ratio and their median. With mpirun on the path, as many launches
of ``gradsync bench --backend mpi --algorithms ring`` give Open MPI's Allreduce (``native``
there); MPI runs in other launches, so its ratio is the median of MPI's time over the median
of ring-on-shm's time.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys


def bench(workers: int, sizes: str, *extra: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gradsync", "bench", "--workers", str(workers), "--algorithms", "ring",
                          "--sizes", sizes, "--format", "json", *extra], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gradsync bench failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def times(rows: list[dict], algorithm: str) -> dict[int, float]:
    return {r["bytes"]: r["time_s"] for r in rows if r["algorithm"] == algorithm}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--sizes", default="4KB,1MB,16MB,64MB")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mpi = not args.no_mpi and shutil.which("mpirun") is not None
    results = {}
    for n in map(int, args.workers.split(",")):
        shm, gloo, ratios, mpi_native = {}, {}, {}, {}
        for _ in range(args.launches):
            rows = bench(n, args.sizes, "--transport", "shm")
            assert all(r["max_error"] < 1e-5 for r in rows), rows
            ring, native = times(rows, "ring"), times(rows, "native")
            for b in ring:
                shm.setdefault(b, []).append(ring[b])
                gloo.setdefault(b, []).append(native[b])
                ratios.setdefault(b, []).append(native[b] / ring[b])
            if mpi:
                for b, t in times(bench(n, args.sizes, "--backend", "mpi"), "native").items():
                    mpi_native.setdefault(b, []).append(t)
        per_size = {}
        for b in shm:
            row = {"ring_shm_s": statistics.median(shm[b]), "gloo_all_reduce_s": statistics.median(gloo[b]),
                   "gloo_over_shm_per_launch": ratios[b], "gloo_over_shm": statistics.median(ratios[b])}
            line = (f"N = {n}, {b / 1e6:g} MB: ring on shm {row['ring_shm_s'] * 1e6:.0f} us, Gloo all_reduce "
                    f"{row['gloo_all_reduce_s'] * 1e6:.0f} us: x{row['gloo_over_shm']:.2f} "
                    f"(launches {', '.join(f'{x:.2f}' for x in ratios[b])})")
            if b in mpi_native:
                row["mpi_allreduce_s"] = statistics.median(mpi_native[b])
                row["mpi_over_shm"] = row["mpi_allreduce_s"] / row["ring_shm_s"]
                line += f"; MPI Allreduce {row['mpi_allreduce_s'] * 1e6:.0f} us: x{row['mpi_over_shm']:.2f}"
            per_size[b] = row
            print(line, flush=True)
        results[n] = per_size
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"launches": args.launches, "mpi": mpi, "workers": results}, f, indent=1)


if __name__ == "__main__":
    main()
