"""PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression
for Distributed Optimization", NeurIPS 2019): a rank-r approximation by one step of power
iteration, warm-started from the previous step, with error feedback.

The flat bucket is viewed as a matrix of ``rows x cols`` (cols = ceil(sqrt(n)), zero-padded),
and per step, as the paper's Algorithm 1:

1. M = gradient + the error carried over from this bucket's last step
2. P = M Q, with Q this bucket's Q of the last step (a seeded Gaussian the first time)
3. all-reduce P (exact schedule), then orthonormalize it: P^
4. Q = M^T P^; the error carried over becomes M - P^ Q^T (what this worker's share missed)
5. all-reduce Q (exact schedule); the result is P^ Q^T, kept as next step's warm start

Two all-reduces of r (rows + cols) elements instead of one of rows x cols.
"""

from __future__ import annotations

import math

import torch

from .base import Codec, Wire, with_feedback

SUMMARY = "rank-r power iteration with warm start and error feedback: two all-reduces of r(rows + cols)"


def shape(elements: int) -> tuple[int, int]:
    """The matrix a flat bucket of ``elements`` is viewed as. ``shape(10)`` is (3, 4)."""
    cols = max(1, math.isqrt(max(elements - 1, 0)) + 1)
    return max(1, -(-elements // cols)), cols


def initial_q(cols: int, rank: int, seed: int = 0) -> torch.Tensor:
    """The first step's Q, the same on every worker: ``initial_q(4, 1).shape`` is (4, 1)."""
    return torch.randn(cols, rank, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


class PowerSgd(Codec):
    """``PowerSgd(rank=4).reduce(grad, exchange, key=bucket)`` sums a rank-4 approximation of the
    workers' gradients into ``grad``; options ``rank`` (r >= 1), ``error_feedback``, ``seed``."""

    name = "powersgd"
    stateful = True

    def _rank(self, rows, cols):
        return min(self.options.get("rank", 1), rows, cols)

    def reduce(self, flat, exchange, key=None):
        n = flat.numel()
        if n == 0:
            return flat
        rows, cols = shape(n)
        r = self._rank(rows, cols)
        work, error = with_feedback(self, flat.view(-1), key)
        m = torch.zeros(rows * cols, dtype=torch.float32)
        m[:n] = work
        m = m.view(rows, cols)
        q = self.state(("q", key, n), lambda: initial_q(cols, r, self.options.get("seed", 0)))
        p = m @ q
        exchange.all_reduce(p)
        p_hat = torch.linalg.qr(p).Q
        q_new = m.T @ p_hat
        if error is not None:
            error.copy_((m - p_hat @ q_new.T).view(-1)[:n])
        exchange.all_reduce(q_new)
        q.copy_(q_new)                       # the warm start of the next step
        flat.view(-1).copy_((p_hat @ q_new.T).view(-1)[:n])
        return flat

    def wire(self, workers, elements):
        rows, cols = shape(elements)
        r = self._rank(rows, cols)
        return [Wire(("all_reduce", rows * r, "float32")), Wire(("all_reduce", cols * r, "float32"))]

    def compute_elements(self, elements):
        rows, cols = shape(elements)
        return float(elements) * (1 + 4 * self._rank(rows, cols))    # M Q, M^T P, P Q^T twice
