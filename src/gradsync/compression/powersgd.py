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
    workers' gradients into ``grad``; options ``rank`` (r >= 1), ``error_feedback``, ``seed``.

    ``layout(key, shapes)`` tells it the tensors a bucket holds (the DDP hook does): then, as
    in the paper and DDP's PowerSGD hook, each tensor of 2 or more dimensions is its own matrix
    (first dimension by the rest), and vectors and matrices too small to gain from rank r go
    exactly, in the second all-reduce. Without a layout the bucket is one near-square matrix.
    """

    name = "powersgd"
    stateful = True

    def _pieces(self, elements: int, key) -> list[tuple[int, int, int, bool]]:
        """(offset, rows, cols, compressed) covering the bucket: one padded matrix by default."""
        shapes = self.shapes(key, elements)
        r = self.options.get("rank", 1)
        if not shapes:
            rows, cols = shape(elements)
            return [(0, rows, cols, True)]
        pieces, offset = [], 0
        for s in shapes:
            count = math.prod(s)
            rows = s[0] if len(s) >= 2 else count
            cols = count // rows if rows else 0
            pieces.append((offset, rows, cols, len(s) >= 2 and r * (rows + cols) < count))
            offset += count
        return pieces

    def reduce(self, flat, exchange, key=None):
        n = flat.numel()
        if n == 0:
            return flat
        pieces = self._pieces(n, key)
        work, error = with_feedback(self, flat.view(-1), key)
        padded = torch.zeros(max(n, sum(rows * cols for _, rows, cols, _ in pieces)), dtype=torch.float32)
        padded[:n] = work
        matrices, qs, exact = [], [], []
        for offset, rows, cols, compressed in pieces:
            if compressed:
                r = min(self.options.get("rank", 1), rows, cols)
                matrices.append(padded[offset:offset + rows * cols].view(rows, cols))
                qs.append(self.state(("q", key, n, offset, rows, cols), lambda: initial_q(cols, r, self.options.get("seed", 0))))
            else:
                exact.append(work[offset:offset + rows * cols])
        ps = [m @ q for m, q in zip(matrices, qs)]
        p_all = torch.cat([p.reshape(-1) for p in ps]) if ps else torch.zeros(0)
        if ps:
            exchange.all_reduce(p_all)
        p_hats, at = [], 0
        for p in ps:
            p_hats.append(torch.linalg.qr(p_all[at:at + p.numel()].view(p.shape)).Q)
            at += p.numel()
        q_news = [m.T @ p_hat for m, p_hat in zip(matrices, p_hats)]
        if error is not None:
            error.zero_()             # what goes exactly leaves no error
            for (offset, rows, cols, compressed), m, p_hat, q_new in zip(
                    [x for x in pieces if x[3]], matrices, p_hats, q_news):
                left = (m - p_hat @ q_new.T).reshape(-1)
                count = min(rows * cols, n - offset)
                error[offset:offset + count] = left[:count]
        second = torch.cat([q.reshape(-1) for q in q_news] + exact)
        exchange.all_reduce(second)
        out, at, k = flat.view(-1), 0, 0
        for q, q_new in zip(qs, q_news):
            q.copy_(second[at:at + q_new.numel()].view(q_new.shape))     # the warm start of the next step
            at += q_new.numel()
        for offset, rows, cols, compressed in pieces:
            count = min(rows * cols, n - offset)
            if compressed:
                out[offset:offset + count] = (p_hats[k] @ qs[k].T).reshape(-1)[:count]
                k += 1
            else:
                out[offset:offset + count] = second[at:at + count]
                at += count
        return flat

    def wire(self, workers, elements, key=None):
        pieces = self._pieces(elements, key)
        r = self.options.get("rank", 1)
        first = sum(rows * min(r, rows, cols) for _, rows, cols, c in pieces if c)
        second = sum(cols * min(r, rows, cols) if c else rows * cols for _, rows, cols, c in pieces)
        return [Wire(("all_reduce", first, "float32")), Wire(("all_reduce", second, "float32"))]

    def compute_elements(self, elements):
        rows, cols = shape(elements)
        return float(elements) * (1 + 4 * min(self.options.get("rank", 1), rows, cols))
