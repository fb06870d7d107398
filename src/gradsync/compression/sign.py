"""Scaled sign compression with error feedback (Karimireddy et al., "Error Feedback Fixes SignSGD
and other Gradient Compression Schemes", ICML 2019; the 1-bit codecs of BytePS and DeepSpeed).

Each worker sends one bit per entry, the sign of its gradient plus carried error (>= 0 is +),
and a float32 scale per tensor, its mean magnitude ||x||_1 / n, so that scale x sign keeps each
tensor's L1 norm (layer-wise, as in that paper); it carries x - scale x sign to the next step.
Bits and scales go by all-gather; every worker sums scale_w x sign_w over the workers. Without
a layout (a bare ``all_reduce``) the bucket is one tensor with one scale.
"""

from __future__ import annotations

import math

import torch

from .base import Codec, Wire, with_feedback

SUMMARY = "1 bit per entry plus a float32 scale, with error feedback; all-gathered"
_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack(bits: torch.Tensor) -> torch.Tensor:
    """Booleans to bytes, most significant bit first (as numpy.packbits):
    ``pack(torch.tensor([True] + [False] * 7)).tolist()`` is [128]."""
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8)
    padded[:bits.numel()] = bits.to(torch.uint8)
    return (padded.view(-1, 8) * _WEIGHTS).sum(1, dtype=torch.uint8)


_SIGNS = (torch.arange(256, dtype=torch.uint8).unsqueeze(-1) & _WEIGHTS).ne(0).float() * 2 - 1   # byte -> 8 signs


def unpack(packed: torch.Tensor, count: int) -> torch.Tensor:
    """Bytes (..., m) to booleans (..., count): the inverse of ``pack``."""
    return signs(packed, count) > 0


def signs(packed: torch.Tensor, count: int) -> torch.Tensor:
    """Bytes (..., m) to +1.0 / -1.0 (..., count), one table lookup per byte:
    ``signs(pack(torch.tensor([True, False])), 2).tolist()`` is [1.0, -1.0]."""
    return _SIGNS[packed.long()].reshape(*packed.shape[:-1], -1)[..., :count]


class Sign(Codec):
    """``Sign().reduce(grad, exchange, key=bucket)`` sums the workers' scaled signs into ``grad``;
    option ``error_feedback``."""

    name = "sign"
    stateful = True

    def _counts(self, elements: int, key) -> torch.Tensor:
        shapes = self.shapes(key, elements)
        return torch.tensor([math.prod(s) for s in shapes] if shapes else [elements])

    def reduce(self, flat, exchange, key=None):
        n = flat.numel()
        if n == 0:
            return flat
        counts = self._counts(n, key)
        tensor_of = torch.repeat_interleave(torch.arange(len(counts)), counts)
        work, error = with_feedback(self, flat.view(-1), key)
        positive = work >= 0
        scales = torch.zeros(len(counts)).index_add_(0, tensor_of, work.abs()) / counts.clamp(min=1)
        if error is not None:
            error.copy_(work - torch.where(positive, 1.0, -1.0) * scales[tensor_of])
        payload = torch.cat([pack(positive), scales.view(torch.uint8)])
        gathered = exchange.all_gather(payload)
        tail = 4 * len(counts)
        all_scales = gathered[:, -tail:].contiguous().view(torch.float32)        # (workers, tensors)
        received = signs(gathered[:, :-tail], n)                                  # (workers, n)
        flat.view(-1).copy_((received * all_scales[:, tensor_of]).sum(0))
        return flat

    def wire(self, workers, elements, key=None):
        return [Wire(("all_gather", -(-elements // 8) + 4 * len(self._counts(elements, key)), "uint8"))]

    def compute_elements(self, elements):
        return 4.0 * elements        # sign and scale, packing, unpacking, the scaled sum
