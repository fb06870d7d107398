"""CERAR encode + decode throughput per worker, against a plain copy of the same data.

Usage: python benchmarks/cerar_codec_speed.py [--elements 16777216] [--repeats 7]
For N in {4, 8, 16} and c in {N, 1.5N, 2N, 3N}, float32: one worker's encode (one
(L x c) @ (c x m) product giving every round's packet update F_j) and decode (one
(c x 2c) @ (2c x m) product), timed as medians, in numpy and in torch, each against its own
copy of the gradient into a preallocated buffer (target: at least 20% of copy
bandwidth for c <= 2N). The L per-round adds (forward what arrived plus F_j(t)) are the
protocol's reduction work, like ring's adds, and are listed apart.
"""

import argparse

import numpy as np
import torch

from gradsync.coding import cerar

from common import median_time as median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=16 << 20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    d = args.elements
    grad = np.random.default_rng(0).standard_normal(d, dtype=np.float32)
    target = np.empty_like(grad)
    copy_np = median(lambda: np.copyto(target, grad), args.repeats)
    tgrad, ttarget = torch.from_numpy(grad), torch.empty(d)
    copy_t = median(lambda: ttarget.copy_(tgrad), args.repeats)
    print(f"gradient: {d} float32 ({grad.nbytes / 1e6:.0f} MB); copy: numpy {grad.nbytes / copy_np / 1e9:.2f} GB/s, "
          f"torch ({torch.get_num_threads()} threads) {grad.nbytes / copy_t / 1e9:.2f} GB/s; medians of {args.repeats}")
    print(f"{'N':>3} {'c':>3} {'L':>3} | {'numpy enc+dec':>13} {'of copy':>7} | {'torch enc+dec':>13} {'of copy':>7} "
          f"| {'L adds':>7}")
    for n in (4, 8, 16):
        for c in sorted({n, int(1.5 * n), 2 * n, 3 * n}):
            design = cerar.make(n, c, "optimized", dtype="float32")
            m = -(-d // c)
            raw = np.empty((2 * c, m), np.float32)
            raw[c:] = cerar.split(grad[None], c)[0]
            raw[:c] = raw[c:]                                 # stands in for the received window
            send, dec = design.sender(1).astype(np.float32), design.decoder(1).astype(np.float32)
            f, est = np.empty((design.rounds, m), np.float32), np.empty((c, m), np.float32)
            t_np = median(lambda: (np.matmul(send, raw[c:], out=f), np.matmul(dec, raw, out=est)), args.repeats)
            traw, tsend, tdec = torch.from_numpy(raw), torch.from_numpy(send), torch.from_numpy(dec)
            tf, test_ = torch.from_numpy(f), torch.from_numpy(est)
            t_t = median(lambda: (torch.matmul(tsend, traw[c:], out=tf), torch.matmul(tdec, traw, out=test_)),
                         args.repeats)
            packet = np.zeros(m, np.float32)
            t_add = median(lambda: [np.add(packet, f[t], out=packet) for t in range(design.rounds)], args.repeats)
            print(f"{n:>3} {c:>3} {design.rounds:>3} | {t_np * 1e3:>10.1f} ms {copy_np / t_np:>7.0%} | "
                  f"{t_t * 1e3:>10.1f} ms {copy_t / t_t:>7.0%} | {t_add * 1e3:>4.1f} ms")


if __name__ == "__main__":
    main()
