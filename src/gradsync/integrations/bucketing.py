"""Fuse many small tensors into buckets before synchronizing them (D2L's "large burst
transfers"): one collective per bucket instead of one per tensor."""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..errors import ConfigError
from ..runtime.api import all_reduce

DEFAULT_BUCKET_BYTES = 25 << 20   # DDP's default


def buckets(tensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Group tensor indices, in order, into buckets of one dtype and device of at most
    ``bucket_bytes`` (a larger tensor gets a bucket of its own).

    >>> buckets([torch.ones(3), torch.ones(3), torch.ones(3, dtype=torch.float64)], 16)
    [[0], [1], [2]]
    """
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
    out, size, key = [], 0, None
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        k = (t.dtype, t.device)
        if not out or k != key or size + nbytes > bucket_bytes:
            out.append([])
            size, key = 0, k
        out[-1].append(i)
        size += nbytes
    return out


def all_reduce_coalesced(tensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES, **kwargs) -> list[torch.Tensor]:
    """All-reduce a list of tensors in place, bucket by bucket; ``kwargs`` go to ``all_reduce``.

    Example, in each of N processes: ``all_reduce_coalesced([p.grad for p in model.parameters()],
    algorithm="ring", op="avg")``.
    """
    tensors = list(tensors)
    for group in buckets(tensors, bucket_bytes):
        members = [tensors[i] for i in group]
        flat = _flatten_dense_tensors(members)
        all_reduce(flat, **kwargs)
        for t, synced in zip(members, _unflatten_dense_tensors(flat, members)):
            t.copy_(synced)
    return tensors
