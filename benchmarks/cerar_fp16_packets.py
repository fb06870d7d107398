"""CERAR with fp16 packets: the least error its unity designs reach, against fp16 over the ring.

Usage: python benchmarks/cerar_fp16_packets.py [--elements 4096]
For each (N, c), the relative L2 error of the worst worker on Gaussian gradients, with every
product and packet in float16 (``cerar.measure``): for
c > N the unity design with per-worker scales at the eps of least measured error on a grid
(gradsync's default design is chosen on a prediction, cond(M) sqrt(L) u, that overstates
float16's rounding about 10x), and the error gradsync's own check (``checked_error``) holds
that design to. The bytes each worker sends are (c + N - 2)/c of the gradient in float16,
against the fp16 ring's 2(N - 1)/N. The last column is the error of casting each worker's
gradient to float16 once (the fp16 ring's float16 sums add about as much again). Prints a
markdown table.
"""

import argparse

import numpy as np

from gradsync.coding import cerar

GRID = np.geomspace(1e-3, 0.3, 16)


def least_error(workers, components, elements):
    """(error, eps, design) of least measured float16 error (eps None for c <= N, which is exact)."""
    if components <= workers:
        design = cerar.unity(workers, components, scale="per_worker")
        return cerar.measure(design, elements, "float16")["rel_error"], None, design
    found = []
    for eps in GRID:
        design = cerar.unity(workers, components, float(eps), "per_worker")
        found.append((cerar.measure(design, elements, "float16")["rel_error"], float(eps), design))
    return min(found, key=lambda f: f[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4096)
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((8, args.elements))
    print("| N | c | bytes vs fp16 ring | error, fp16 packets | eps | gradsync's check of it | "
          "CERAR float32 (default design) | one fp16 cast |")
    print("|---|---|---|---|---|---|---|---|")
    for n, c in ((4, 4), (4, 6), (4, 8), (8, 8), (8, 12), (8, 16)):
        error, eps, design = least_error(n, c, args.elements)
        f32 = cerar.measure(cerar.best(n, c, "float32"), args.elements, "float32")["rel_error"]
        inputs, exact = x[:n] / n, x[:n].sum(axis=0) / n
        ring = np.linalg.norm(inputs.astype(np.float16).astype(np.float64).sum(axis=0) - exact) / np.linalg.norm(exact)
        print(f"| {n} | {c} | {(c + n - 2) / c / (2 * (n - 1) / n):.2f} | {error:.2g} | "
              f"{'-' if eps is None else f'{eps:.3g}'} | {design.checked_error('float16'):.2g} | {f32:.2g} | {ring:.1g} |")


if __name__ == "__main__":
    main()
