"""fp16: cast each gradient to float16, all-reduce it with the exact schedule, cast back.

As DDP's ``fp16_compress_hook``: half the bytes, no state. The gradient is divided by the
number of workers before the cast and multiplied back after, so the float16 sum stays below
its largest value (65504) wherever the average does; each value keeps 11 significant bits.
"""

from __future__ import annotations

import torch

from .base import Codec, Exchange, Wire

SUMMARY = "cast to float16, exact all-reduce, cast back: half the bytes, 11-bit mantissa"


def cast_reduce(flat: torch.Tensor, exchange: Exchange, dtype: torch.dtype) -> torch.Tensor:
    """Sum ``flat`` over the workers as ``dtype`` on the wire (shared by fp16 and bf16)."""
    n = exchange.workers
    packed = flat.div_(n).to(dtype)          # in place: flat is overwritten with the result anyway
    exchange.all_reduce(packed)
    return flat.copy_(packed).mul_(n)


class Fp16(Codec):
    """``Fp16().reduce(grad, exchange)`` sums ``grad`` over the workers in float16."""

    name = "fp16"
    dtype = torch.float16

    def reduce(self, flat, exchange, key=None):
        return cast_reduce(flat, exchange, self.dtype)

    def wire(self, workers, elements, key=None):
        return [Wire(("all_reduce", elements, str(self.dtype).removeprefix("torch.")))]

    def compute_elements(self, elements):
        return 2.0 * elements       # the cast down and the cast back
