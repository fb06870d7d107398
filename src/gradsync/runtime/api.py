"""``gradsync.all_reduce``: any gradsync algorithm, in place, between real processes."""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.distributed as dist

from .. import algorithms
from ..errors import ConfigError, NonFiniteError
from ..core.plan import Plan, compile_plan
from ..core.schedule import CODED, COPY, REDUCE, Schedule
from .agree import Agreement, digest, seen_before
from .transport.hosts import local_size
from .collective import Collective, node_buffers
from .transport import for_group

OPS = ("sum", "avg")
DEFAULT_TIMEOUT = float(os.environ.get("GRADSYNC_TIMEOUT", 60.0))
PLAN_CACHE = 64
_SUPPORTED = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
              torch.int16, torch.int32, torch.int64}


class Compiled(NamedTuple):
    schedule: Schedule
    plan: Plan
    design: object      # the codec's design (CERAR), or None


def frozen(options: dict) -> str:
    """Options as canonical text, for cache keys and agreement: ``frozen({"b": 1, "a": 2})``."""
    return json.dumps(options, sort_keys=True, default=str)


@lru_cache(maxsize=PLAN_CACHE)
def compiled(algorithm: str, workers: int, elements: int, dtype: str, frozen_options: str, rank: int,
             ops: tuple = (REDUCE, COPY, CODED)) -> Compiled:
    """The schedule, this rank's plan and the codec's design of one collective, by value
    (a training loop compiles once per bucket; the cache holds PLAN_CACHE of them).

    >>> c = compiled("ring", 4, 1000, "float32", "{}", 1)
    >>> c.schedule.rounds, len(c.plan.sends)
    (6, 6)
    """
    options = json.loads(frozen_options)
    schedule = algorithms.build(algorithm, workers, elements, dtype=dtype, **options)
    itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    design = None
    if schedule.codec is not None:
        from ..coding import cerar
        design = cerar.Design.from_dict(schedule.codec)
    return Compiled(schedule, compile_plan(schedule, rank, itemsize, ops), design)


def pick(tensor: torch.Tensor, workers: int) -> tuple[str, dict]:
    """``algorithm="auto"``: the least predicted time on the topology in GRADSYNC_TOPOLOGY (a
    calibrated file) or the ethernet preset; cached by the topology's value and the size.

    Example: ``pick(torch.ones(1 << 20), 4)`` gives ``("ring", {...})`` or another algorithm.
    """
    path = os.environ.get("GRADSYNC_TOPOLOGY", "")
    stamp = os.stat(path).st_mtime_ns if path and os.path.exists(path) else 0
    return _pick(path, stamp, workers, tensor.numel() * tensor.element_size(), tensor.element_size(),
                 str(tensor.dtype).removeprefix("torch."))


@lru_cache(maxsize=1024)
def _pick(path: str, stamp: int, workers: int, nbytes: int, itemsize: int, dtype: str) -> tuple[str, dict]:
    from ..model.topology import preset, resolve
    from ..model.tune import choose

    topology = resolve(path, workers) if path else preset("ethernet", workers=workers)
    picked = choose(topology, nbytes, itemsize, dtype=dtype, quick=True)
    return picked.algorithm, picked.kwargs()


class Work:
    """An all-reduce in flight (``all_reduce(..., async_op=True)``), like torch.distributed's Work.

    Example, in each rank::

        work = gradsync.all_reduce(grad, algorithm="ring", async_op=True)
        ...                      # compute on, without touching grad
        work.wait()              # grad now holds the sum (PeerError if a peer failed)
    """

    def __init__(self, future: torch.futures.Future):
        self._future = future

    def wait(self) -> torch.Tensor:
        """Block until done; return the tensor, or raise the collective's error."""
        return self._future.wait()

    def is_completed(self) -> bool:
        return self._future.done()

    def get_future(self) -> torch.futures.Future:
        """The future of the result tensor (what a DDP communication hook returns)."""
        return self._future


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", group=None,
               timeout: float | None = None, check: bool = True, stall_warning: float | None = None,
               check_finite: bool = False, async_op: bool = False, trace=None, transport: str = "gloo",
               compression=None, compression_key=None,
               **options):
    """All-reduce ``tensor`` in place across ``group`` with a gradsync algorithm; return it.

    Like ``torch.distributed.all_reduce``: every rank calls it with a tensor of the same shape
    and dtype, in the same order. ``algorithm`` is a registry name or "auto"; ``options`` go
    to the algorithm (``components=16`` for CERAR). ``async_op=True`` returns a ``Work`` at
    once (``wait()``, ``get_future()``) while the collective runs on gradsync's progress
    thread; leave the tensor alone until it completes. ``transport``: "gloo" (the group's
    torch.distributed backend), "shm" (shared memory; every rank on this host) or "auto"
    (shared memory when the ranks share a host and the tensor is on the CPU).

    The ranks agree on shape, dtype, algorithm and options (``check``) before anything
    received is used; a mismatch raises ``MismatchError`` on every rank. A peer that fails or
    stalls raises ``PeerError`` within ``timeout`` seconds, on every rank, naming the rank
    that failed; ``stall_warning`` seconds logs a warning naming the peer still awaited (a
    straggler) before that. ``check_finite`` adds to the agreement whether each rank's tensor
    is free of NaN and Inf: if one is not, every rank raises ``MismatchError`` naming it,
    before anything is summed (off by default: it reads the tensor once more). ``trace``: a
    ``gradsync.runtime.tracing.Trace`` to record the collective's rounds and transfers in (every
    rank passes one, or none; the ranks agree on it).

    ``compression`` (a float tensor only): a codec of ``gradsync.compression``, as text
    (``"fp16"``, ``"powersgd:rank=4"``, ``"topk:ratio=0.01"``) or a ``Codec``; the algorithm then
    runs the codec's payload (a ``trace`` records each of the codec's collectives). Text makes a new codec per call: pass one ``Codec`` to keep error
    feedback and warm starts across calls, per ``compression_key`` (default: shape and dtype).

    Example, in each of N processes after ``dist.init_process_group("gloo", ...)``::

        grad = torch.ones(1000)
        gradsync.all_reduce(grad, algorithm="halving_doubling", op="avg")
        work = gradsync.all_reduce(grad, algorithm="ring", async_op=True); work.wait()
    """
    timeout = check_call(tensor, op, timeout)
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first "
                          "(or use gradsync.tools.launch)")
    if stall_warning is not None and not (isinstance(stall_warning, (int, float)) and 0 < stall_warning):
        raise ConfigError(f"stall_warning must be a positive number of seconds, got {stall_warning!r}")
    deadline = time.monotonic() + timeout
    codec = None
    if compression is not None:
        codec = compressed_codec(tensor, algorithm, compression)
    channel = for_group(transport, group, tensor.device.type, timeout, stall_warning)
    try:
        if codec is not None:
            from .compressed import CompressedAllReduce, TransportExchange
            exchange = TransportExchange(channel, algorithm, options, deadline, check, trace)
            collective = CompressedAllReduce(tensor, codec, exchange, op, compression_key)
        else:
            collective = prepare(tensor, algorithm, op, channel, deadline, check, check_finite, options, trace)
    except BaseException:
        channel.close()
        raise
    future = collective.start(inline=not async_op)
    return Work(future) if async_op else future.wait()


def compressed_codec(tensor, algorithm: str, compression):
    """The codec of ``all_reduce(..., compression=...)``, checked before anything is posted:
    ``compressed_codec(torch.ones(4), "ring", "fp16").label`` is 'fp16'."""
    from .. import compression as codecs
    codec = codecs.make(compression)
    if not tensor.is_floating_point():
        raise ConfigError(f"compression {codec.label!r} needs a float tensor, got {tensor.dtype}")
    if algorithm != "auto":
        algorithms.get(algorithm)
    return codec


def check_call(tensor, op: str, timeout) -> float:
    """Validate what every engine's all_reduce takes; return the timeout in seconds."""
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _SUPPORTED:
        raise ConfigError(f"dtype {tensor.dtype} is not supported: expected a float or integer type")
    if op not in OPS:
        raise ConfigError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ConfigError(f"op 'avg' needs a float tensor, got {tensor.dtype}")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < 1e7:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def prepare(tensor, algorithm, op, transport, deadline, check=True, check_finite=False,
            options=None, trace=None) -> Collective:
    """The engine-independent part of an all-reduce: choose, compile (cached), and set up the
    agreement; returns the ``Collective`` to start. Bad input raises here, before anything
    is posted.

    Example, with any transport: ``prepare(grad, "ring", "sum", transport, deadline).start().wait()``.
    """
    options = dict(options or {})
    workers = transport.size
    if algorithm == "auto":
        algorithm, picked = pick(tensor, workers)
        options = {**picked, **options}
    dtype = str(tensor.dtype).removeprefix("torch.")
    spec = algorithms.get(algorithm)
    spec.check_dtype(dtype)
    if "local_size" in spec.options and options.get("local_size") is None:
        # machines as the launcher placed the ranks, else as the group's ranks report their hosts
        options["local_size"] = local_size(workers, getattr(transport, "group", False),
                                        max(1.0, deadline - time.monotonic()))
    frozen_options = frozen(options)
    description = {"shape": list(tensor.shape), "dtype": dtype, "algorithm": algorithm, "op": op,
                   "options": json.loads(frozen_options), "device": tensor.device.type}
    if trace is not None:                  # a rank tracing alone would wait for a clock exchange
        description["traced"] = True
    finite = True           # read before the collective starts: an approximate result must stay finite if this was
    if (check_finite or not spec.exact) and tensor.is_floating_point():
        finite = bool(torch.isfinite(tensor).all())
    if check_finite or not spec.exact:     # approximate: agreed too, so a peer's NaN is named, not blamed on the codec
        description["finite"] = finite
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    compiled_ = compiled(algorithm, workers, tensor.numel(), dtype, frozen_options, transport.rank) \
        if workers > 1 else None
    agreement, signature = None, digest(description)
    if (check or check_finite) and workers > 1:
        known = seen_before(getattr(transport, "failure_key", ""), signature)
        # the first time (or with check_finite), before anything moves; after, riding along
        agreement = Agreement(transport, description, not known or check_finite, signature)

    def finish(result: torch.Tensor) -> torch.Tensor:
        if not spec.exact and finite and not bool(torch.isfinite(result).all()):
            raise NonFiniteError(f"rank {transport.rank}: {algorithm} with options {frozen_options} turned a finite "
                                 f"tensor into NaN or Inf: its design is not accurate enough for these values; "
                                 f"use fewer components or an exact algorithm")
        if op == "avg":
            result.div_(workers)
        if result.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            tensor.copy_(result.view(tensor.shape))
        return tensor

    if compiled_ is None:
        return _Done(tensor, transport)
    return Collective(compiled_.schedule, compiled_.plan, node_buffers(compiled_.schedule, transport.rank, flat),
                      transport, deadline, agreement, finish, salt=int.from_bytes(signature[:4], "little"),
                      design=compiled_.design, trace=trace)


class _Done:
    """A one-rank group's all-reduce: nothing to move."""

    def __init__(self, tensor, transport):
        self.tensor, self.transport = tensor, transport

    def start(self, inline: bool = False) -> torch.futures.Future:
        self.transport.close()
        future = torch.futures.Future()
        future.set_result(self.tensor)
        return future


def run_all_reduce(tensor, algorithm, op, transport, deadline, check=True, check_finite=False, options=None,
                   trace=None):
    """Prepare and run an all-reduce to the end in this thread (engines without a progress
    thread of their own, e.g. MPI); return the tensor."""
    return prepare(tensor, algorithm, op, transport, deadline, check, check_finite, options,
                   trace).start(inline=True).wait()
