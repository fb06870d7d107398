"""Approximate gradient sync under unchanged training code: the gradients DDP all-reduces
(and HSDP's replicate dimension, and FSDP2's reduce-scatters in fp16 or bf16) travel as a
codec's payload or by CERAR; everything else stays exact.

Ask for it with ``GRADSYNC_GRADIENTS`` ("fp16", "bf16", "powersgd:rank=4", "topk:ratio=0.01",
"sign", "cerar:components=8", or "exact", the default) or ``configure(gradients=...)``; it is
read when a group is made, and a bad value or a CERAR design too inaccurate for the group's
size fails ``init_process_group`` with a ``ConfigError`` naming it, before any step.

What counts as a gradient: a floating-point all-reduce (SUM or AVG) or reduce-scatter started
inside a backward pass, that is while the autograd engine runs a graph task, which is where
DDP's reducer and FSDP2's post-backward hooks start theirs. A loss or a metric the training
loop all-reduces, the parameters DDP broadcasts at its start, buffers and integer maps (DDP's
unused-parameter bitmap) are never touched. A reduce-scatter takes fp16 and bf16 only: the
other codecs compress a whole matrix or rank a whole bucket's values, which one rank's shard
of a sum is not; with them FSDP2's reduce-scatters stay exact (said once in the log).

Each setting's error bound (``Setting.bound``) is logged once, when the first group takes it:

- fp16 / bf16: every element of the result within (N + 1) (u sum_i |g_i| + N eta) of the exact
  sum of the tensors g_i the ranks hand over (u = 2^-11 / 2^-8, eta = 2^-25 / 2^-134, half the
  spacing of the wire type's subnormals, near zero: each gradient is cast after division by N,
  and each of the partial sums on the way is rounded once);
- cerar: the design's predicted relative error (2-norm) at most its ``max_error`` (1e-2 by
  default), the design refused when it is not;
- powersgd, topk, sign: biased, with no bound per step; their error feedback carries what a
  step leaves out into the next, so the gradients applied over T steps sum to the exact ones
  less what the workers still carry (one step's residual).

This module owns the process's setting (through ``config``) and, per group, one ``Gradients``:
its codec's state (error feedback, PowerSGD's warm starts, at most ``Codec.STATES`` buckets)
and the position of each call in the current backward pass, which names its bucket.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..errors import ConfigError

ENV = "GRADSYNC_GRADIENTS"
EXACT = "exact"
ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}     # unit roundoff of each cast
FLOOR = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}      # half the spacing of its subnormals (absolute)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_told: set = set()                                    # settings already logged in this process (bounded by their texts)


@dataclass(frozen=True)
class Setting:
    """One gradient-sync setting, checked: its ``name`` ("exact", "cerar" or a codec's) and
    options. ``parse`` makes it.

    >>> parse("fp16").takes("reduce_scatter"), parse("powersgd:rank=2").takes("reduce_scatter")
    (True, False)
    """

    text: str
    name: str
    options: tuple = ()

    @property
    def exact(self) -> bool:
        return self.name == EXACT

    def takes(self, kind: str) -> bool:
        """Whether gradients of collective ``kind`` travel approximately."""
        if self.exact:
            return False
        return kind == "all_reduce" or (kind == "reduce_scatter" and self.name in ROUNDOFF)

    def check(self, workers: int) -> None:
        """Refuse (ConfigError) what cannot meet its bound for ``workers`` ranks: a CERAR design
        whose predicted error passes max_error, or one that needs more ranks."""
        if self.name == "cerar" and workers > 1:
            try:
                self.design(workers)
            except ConfigError as exc:
                raise ConfigError(f"{ENV}={self.text!r} for {workers} ranks: {exc}") from None

    def bound(self, workers: int) -> str:
        """The error bound this setting keeps at every step, in words with its numbers.

        >>> parse("fp16").bound(4)
        'fp16: every element within 5 x (2^-11 sum_i |g_i| + 4 x 2^-25) of the exact sum (casts and partial sums)'
        """
        if self.exact:
            return "exact"
        if self.name in ROUNDOFF:
            u, eta = (round(math.log2(x[self.name])) for x in (ROUNDOFF, FLOOR))
            return (f"{self.name}: every element within {workers + 1} x (2^{u} sum_i |g_i| + {workers} x 2^{eta}) "
                    "of the exact sum (casts and partial sums)")
        if self.name == "cerar":
            design = self.design(workers)
            return (f"{self.text}: predicted relative error {design.checked_error('float32'):.3g} "
                    f"at most max_error {dict(self.options).get('max_error', _cerar_default()):g}")
        return (f"{self.text}: no bound per step (biased); error feedback carries what a step leaves "
                "out into the next, so T steps apply the exact sum less one step's residual")

    def design(self, workers: int):
        """CERAR's design for ``workers`` ranks with these options."""
        from .. import algorithms, coding

        schedule = algorithms.build("cerar", workers, workers * 64, **dict(self.options))
        return coding.design(schedule.codec)


def _cerar_default() -> float:
    from ..coding.cerar import DEFAULT_MAX_ERROR

    return DEFAULT_MAX_ERROR


@lru_cache(maxsize=16)
def parse(text: str) -> Setting:
    """``GRADSYNC_GRADIENTS``' text as a checked ``Setting``; ConfigError naming it and what
    is allowed.

    >>> parse("powersgd:rank=4").options
    (('rank', 4),)
    >>> parse("gzip")
    Traceback (most recent call last):
    ...
    gradsync.errors.ConfigError: GRADSYNC_GRADIENTS: unknown gradient sync 'gzip': expected exact, cerar or a codec (bf16, fp16, powersgd, sign, topk), with options after ':' as in 'powersgd:rank=4'
    """
    from .. import compression

    if not isinstance(text, str):
        raise ConfigError(f"{ENV}: expected text such as 'fp16' or 'powersgd:rank=4', got {text!r}")
    name, options = compression.parse(text) if text.strip() else (EXACT, {})
    if name == EXACT:
        if options:
            raise ConfigError(f"{ENV}: 'exact' takes no options, got {text!r}")
    elif name == "cerar":
        from .. import algorithms

        spec = algorithms.get("cerar")
        spec.check_options(options)
    elif name in compression.REGISTRY:
        compression.make(name, **options)
    else:
        raise ConfigError(f"{ENV}: unknown gradient sync {name!r}: expected exact, cerar or a codec "
                          f"({', '.join(sorted(compression.names()))}), with options after ':' as in 'powersgd:rank=4'")
    return Setting(text.strip() or EXACT, name, tuple(sorted(options.items())))


def for_group(text: str, group, workers: int, current: "Gradients | None" = None) -> "Gradients | None":
    """A group's ``Gradients`` for the setting ``text`` (None: exact): ``current`` kept while
    the setting is the same (its codec's state with it), else a new one, checked for the
    group's size first (a CERAR design that cannot meet its bound is refused before any step).

    >>> for_group("exact", None, 4) is None
    True
    """
    setting = parse(text)
    if setting.exact:
        return None
    if current is not None and current.setting == setting:
        return current
    setting.check(workers)
    return Gradients(setting, group, workers)


def in_backward() -> bool:
    """Whether this thread runs inside a backward pass (the autograd engine's graph task).

    >>> in_backward()
    False
    """
    return torch._C._current_graph_task_id() != -1


class Gradients:
    """A group's approximate gradient sync: ``wanted(kind, tensor, op)`` says whether a call is
    a gradient this setting takes; ``all_reduce`` / ``reduce_scatter`` start it as gradsync's
    ``all_reduce`` does, returning its ``runtime.pending.Pending`` (async) or None (done).

    Example: ``Gradients(parse("fp16"), group, 4).all_reduce(grad, "avg", True)``.
    """

    def __init__(self, setting: Setting, group, workers: int):
        self.setting, self.group, self.workers = setting, group, workers
        self.told = set() if group.rank() == 0 else None     # kinds logged; only rank 0 logs (one line a job)
        self.codec = None
        if setting.name not in (EXACT, "cerar"):
            from .. import compression

            self.codec = compression.make(setting.name, **dict(setting.options))
        self.task, self.position = -1, 0          # the backward pass, and this call's place in it

    def wanted(self, kind: str, tensor: torch.Tensor, op: str) -> bool:
        """A floating-point SUM or AVG of ``kind`` inside a backward pass that the setting takes."""
        if not (op in ("sum", "avg") and tensor.dtype in FLOATS and in_backward()):
            return False
        takes = self.setting.takes(kind)
        if self.told is not None and kind not in self.told:      # once per kind, then never again
            self.told.add(kind)
            _tell(self.setting, self.workers, None if takes else
                  f"{self.setting.text} does not take FSDP2's reduce-scatters: they stay exact (fp16 and bf16 do)")
        return takes

    def all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool):
        """All-reduce the gradient ``tensor`` in place approximately: CERAR's schedule, or the
        codec on the group's communicator, in start order with the group's other collectives."""
        if self.setting.name == "cerar":
            from ..runtime import api

            work = api.all_reduce(tensor, "cerar", op, group=self.group, async_op=True, **dict(self.setting.options))
            if not async_op:
                work.wait()
                return None
            return work._pending
        key = self._key(tensor)
        comm = self.group.communicator()
        out = comm.run(lambda t: self._coded(comm, t, op, key), (tensor,), async_op)
        return out if async_op else None

    def _coded(self, comm, tensor: torch.Tensor, op: str, key) -> torch.Tensor:
        """The codec's whole step on ``tensor`` (run as one of the group's collectives)."""
        with torch.no_grad():
            flat = tensor.detach().reshape(-1).to(torch.float32)
            self.codec.reduce(flat, CommunicatorExchange(comm), key)
            if op == "avg":
                flat /= self.workers
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str, comm, choice: str, async_op: bool):
        """Reduce-scatter ``input`` into ``output`` with the sum cast to fp16 or bf16 on the wire:
        divided by N before the cast (so the sum stays in range where the average is), as the
        all-reduce codecs do; in this thread, after what the group has queued (``async_op`` is
        met by a finished call)."""
        wire = torch.float16 if self.setting.name == "fp16" else torch.bfloat16
        packed = input.detach().reshape(-1).div(self.workers).to(wire)
        small = torch.empty(output.numel(), dtype=wire)
        scale = 1 if op == "avg" else self.workers
        comm.reduce_scatter(small, packed, "sum", choice, False)
        output.view(-1).copy_(small.to(output.dtype).mul_(scale))
        return None

    def _key(self, tensor: torch.Tensor) -> tuple:
        """A bucket's name: its place in this backward pass and its size (DDP starts its buckets
        in the same order every step; a rebuilt bucket gets new state)."""
        task = torch._C._current_graph_task_id()
        if task != self.task:
            self.task, self.position = task, 0
        self.position += 1
        return (self.position, tensor.numel())


class CommunicatorExchange:
    """The exchange a codec runs its payload's collectives on: the group's communicator, so
    each takes the one choice (``runtime.choice``: the engine for a small payload, hierarchical
    across machines for a large one). ``all_gather`` gives a workers x n tensor, rank by rank.

    Example: ``codec.reduce(flat, CommunicatorExchange(group.communicator()), key)``.
    """

    def __init__(self, comm):
        self.comm, self.workers, self.rank = comm, comm.size, comm.rank

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.comm.all_reduce(tensor, "sum", "auto", False)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.workers * tensor.numel(), dtype=tensor.dtype)
        self.comm.all_gather(out, tensor.reshape(-1), "auto", False)
        return out.view(self.workers, -1)


def _tell(setting: Setting, workers: int, what: str | None = None) -> None:
    """Log, once per process and message, that gradients travel approximately and within what."""
    text = what or f"gradients travel approximately ({ENV}): {setting.bound(workers)}"
    if text not in _told and len(_told) < 64:
        _told.add(text)
        logging.getLogger("gradsync").warning("gradsync: %s", text)
