"""Top-k sparsification with error feedback (as in Stich, Cordonnier and Jaggi, "Sparsified SGD
with Memory", NeurIPS 2018; Lin et al., "Deep Gradient Compression", ICLR 2018).

Each worker keeps the k = ceil(ratio x n) entries of largest magnitude of its gradient plus
carried error, sends them as (value, index) pairs with an all-gather (indices differ between
workers, so they cannot be summed on the way), and carries what it left out to the next step.
Every worker then adds all workers' pairs into a zero tensor: the same sum everywhere.
"""

from __future__ import annotations

import math

import torch

from .base import Codec, Wire, with_feedback

SUMMARY = "largest ratio x n entries with error feedback; values and indices all-gathered"


def kept(elements: int, ratio: float) -> int:
    """Entries each worker sends: ``kept(1000, 0.01)`` is 10."""
    return min(elements, max(1, math.ceil(ratio * elements))) if elements else 0


class TopK(Codec):
    """``TopK(ratio=0.01).reduce(grad, exchange, key=bucket)`` sums the workers' top 1% entries
    into ``grad``; options ``ratio`` in (0, 1], ``error_feedback``."""

    name = "topk"
    stateful = True

    def reduce(self, flat, exchange, key=None):
        n = flat.numel()
        if n == 0:
            return flat
        k = kept(n, self.options.get("ratio", 0.01))
        work, error = with_feedback(self, flat.view(-1), key)
        index = torch.topk(work.abs(), k, sorted=False).indices
        values = work[index]
        if error is not None:
            error.copy_(work)
            error[index] = 0.0
        # indices travel as the bits of float32 values: one message, copied, never added
        payload = torch.cat([values, index.to(torch.int32).view(torch.float32)])
        gathered = exchange.all_gather(payload)
        total = torch.zeros(n, dtype=torch.float32)
        total.index_add_(0, gathered[:, k:].contiguous().view(torch.int32).reshape(-1).long(),
                         gathered[:, :k].reshape(-1))
        flat.view(-1).copy_(total)
        return flat

    def wire(self, workers, elements, key=None):
        return [Wire(("all_gather", 2 * kept(elements, self.options.get("ratio", 0.01)), "float32"))]

    def compute_elements(self, elements):
        return 3.0 * elements        # magnitude, selection, the sum of the gathered pairs
