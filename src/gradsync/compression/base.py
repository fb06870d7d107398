"""What every gradient codec shares: options, per-bucket state with a bound, and the exchange
it is given.

A codec turns one rank's flat gradient into what goes on the wire, runs the exchange (an exact
all-reduce of the payload with the chosen algorithm, or an all-gather), and writes the
decompressed **sum** over the workers back into the tensor (the caller divides for an average).
Codecs with error feedback keep, per bucket, what compression left out and add it to the
next gradient of that bucket.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Protocol

import torch

STATES = 256        # buckets a codec remembers; DDP models have tens, so this bound is never hit in training


class Exchange(Protocol):
    """The collectives a codec may run between the workers (``gradsync.runtime.compressed`` over
    a transport; tests run threads of one process)."""

    workers: int
    rank: int

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the workers, in place, with the exact schedule chosen; return it."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every worker's ``tensor`` (1-D, same size everywhere), as a (workers, size) tensor."""


class Wire(tuple):
    """One collective on the wire: (kind, elements per worker, dtype name), kind "all_reduce" or
    "all_gather". ``Wire(("all_reduce", 10, "float16"))``."""

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def elements(self) -> int:
        return self[1]

    @property
    def dtype(self) -> str:
        return self[2]


class Codec:
    """Base of the codecs: ``reduce(flat, exchange, key)`` and ``wire(workers, elements)``.

    State (error feedback, PowerSGD's warm-started Q) is kept per ``key`` (a DDP bucket's
    index, or the tensor's size), at most STATES keys, least recently used dropped first.
    ``error_feedback`` False turns it off (to show what it is for).
    """

    name = "codec"
    exact = False
    stateful = False

    def __init__(self, **options):
        self.options = options
        self._states: OrderedDict = OrderedDict()

    def __repr__(self):
        return self.label

    @property
    def label(self) -> str:
        """Name with the options given: ``powersgd:rank=4``."""
        given = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return self.name + (":" + given if given else "")

    def state(self, key, make):
        """This key's state, made by ``make()`` the first time."""
        if key not in self._states:
            self._states[key] = make()
            while len(self._states) > STATES:
                self._states.popitem(last=False)
        self._states.move_to_end(key)
        return self._states[key]

    def layout(self, key, shapes) -> None:
        """The shapes of the tensors that fill bucket ``key``, in order (the DDP hook tells
        every codec; PowerSGD and sign use it)."""
        self.state(("layout", key), lambda: None)
        self._states[("layout", key)] = [tuple(s) for s in shapes]

    def shapes(self, key, elements: int):
        """Bucket ``key``'s tensor shapes if a layout covering ``elements`` was given, else None."""
        shapes = self._states.get(("layout", key))
        if shapes and sum(math.prod(s) for s in shapes) == elements:
            return shapes
        return None

    def reset(self) -> None:
        """Forget every bucket's state (error feedback, warm starts)."""
        self._states.clear()

    def reduce(self, flat: torch.Tensor, exchange: Exchange, key=None) -> torch.Tensor:
        raise NotImplementedError

    def wire(self, workers: int, elements: int, key=None) -> list[Wire]:
        """The collectives of one step on bucket ``key`` (its layout, if given, can change them)."""
        raise NotImplementedError

    def compute_elements(self, elements: int) -> float:
        """Work of the codec in elements of the gradient processed (for its time at a rate)."""
        return float(elements)


def with_feedback(codec: Codec, flat: torch.Tensor, key) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradient plus the error this bucket carried over (float32 work copy), and the
    error buffer to update (None without error feedback)."""
    work = flat.detach().to(torch.float32).clone()
    if not codec.options.get("error_feedback", True):
        return work, None
    shapes = codec.shapes(key, flat.numel())        # DDP rebuilds its buckets once: a new layout, a new error
    error = codec.state(("error", key, flat.numel(), tuple(shapes or ())), lambda: torch.zeros_like(work))
    work += error
    return work, error
