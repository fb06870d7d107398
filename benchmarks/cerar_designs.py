"""CERAR designs side by side: rate, cond(M) and error of each construction at its best.

Usage: python benchmarks/cerar_designs.py [--elements 65536]
For N in {4, 8, 16}, c in {N, 1.5N, 2N, 3N}, float32 and float64: communication rate against
ring all-reduce's, and for each construction (unity and vandermonde at the eps that minimises
their predicted error in the dtype; optimized at unity's condition number) cond(M) and the
measured worst-worker relative L2 error on random Gaussian gradients, plus the largest
difference between two workers' estimates for the optimized design.
"""

import argparse

from gradsync.coding import cerar


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 16)
    args = parser.parse_args()
    print("| dtype | N | c | rate | ring | unity eps | unity cond | unity error | vandermonde cond | "
          "vandermonde error | optimized cond | optimized error | optimized spread |")
    print("|" + "---|" * 13)
    for dtype in ("float32", "float64"):
        for n in (4, 8, 16):
            for c in sorted({n, int(1.5 * n), 2 * n, 3 * n}):
                u = cerar.make(n, c, "unity", dtype=dtype)
                v = cerar.make(n, c, "vandermonde", dtype=dtype)
                o = cerar.make(n, c, "optimized", dtype=dtype)
                mu, mv, mo = (cerar.measure(d, args.elements, dtype) for d in (u, v, o))
                eps = f"{u.eps:.2g}" if u.eps else "-"
                print(f"| {dtype} | {n} | {c} | {u.comm_rate:.3f} | {u.ring_rate:.3f} | {eps} | {u.cond:.3g} | "
                      f"{mu['rel_error']:.2g} | {v.cond:.3g} | {mv['rel_error']:.2g} | {o.cond:.3g} | "
                      f"{mo['rel_error']:.2g} | {mo['worker_spread']:.2g} |", flush=True)


if __name__ == "__main__":
    main()
