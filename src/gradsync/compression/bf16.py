"""bf16: cast each gradient to bfloat16, all-reduce it with the exact schedule, cast back.

As DDP's ``bf16_compress_hook``: half the bytes, float32's range, 8 significant bits.
"""

from __future__ import annotations

import torch

from .fp16 import Fp16

SUMMARY = "cast to bfloat16, exact all-reduce, cast back: half the bytes, 8-bit mantissa"


class Bf16(Fp16):
    """``Bf16().reduce(grad, exchange)`` sums ``grad`` over the workers in bfloat16."""

    name = "bf16"
    dtype = torch.bfloat16
