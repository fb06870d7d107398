"""Receive space for collectives, reused across them and bounded: the process's scratch pool.

A collective takes its scratch at start and gives it back when done; idle buffers beyond the
limit are freed, least recently used first, so a training loop allocates once while a one-off
large call does not pin its scratch for the life of the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

SCRATCH_LIMIT_BYTES = 1 << 30


class ScratchPool:
    """Receive space reused across collectives, at most ``limit_bytes`` of it kept idle.

    >>> pool = ScratchPool(limit_bytes=64)
    >>> a = pool.take(torch.float32, torch.device("cpu"), 10); pool.give(a); pool.idle_bytes()
    40
    >>> pool.give(pool.take(torch.float32, torch.device("cpu"), 100)); pool.idle_bytes()   # 440 > 64: both go
    0
    """

    def __init__(self, limit_bytes: int = SCRATCH_LIMIT_BYTES):
        self.limit_bytes = limit_bytes
        self._idle: OrderedDict = OrderedDict()     # (dtype, device, elements, serial) -> tensor
        self._lock = threading.Lock()
        self._serial = 0

    def take(self, dtype, device, elements: int) -> torch.Tensor:
        with self._lock:
            for key in self._idle:
                if key[:3] == (dtype, device, elements):
                    return self._idle.pop(key)
        with torch.inference_mode(False):      # kept for later calls, whatever the mode of this one
            return torch.empty(elements, dtype=dtype, device=device)

    def give(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self._serial += 1
            self._idle[(tensor.dtype, tensor.device, tensor.numel(), self._serial)] = tensor
            while self._idle and self.idle_bytes() > self.limit_bytes:
                self._idle.popitem(last=False)

    def idle_bytes(self) -> int:
        """Bytes held by idle buffers."""
        return sum(t.numel() * t.element_size() for t in self._idle.values())

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()


SCRATCH = ScratchPool()     # the process's one pool: scratch is shared by every group's collectives
