"""``gradsync.all_reduce``: any gradsync algorithm, in place, between real processes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from functools import lru_cache

import torch
import torch.distributed as dist

from .. import algorithms
from ..errors import ConfigError, MismatchError
from .executor import execute
from .transport import TorchTransport

OPS = ("sum", "avg")
DEFAULT_TIMEOUT = float(os.environ.get("GRADSYNC_TIMEOUT", 60.0))
_SIGNATURE_BYTES = 16
_DESCRIPTION_BYTES = 512
_SUPPORTED = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
              torch.int16, torch.int32, torch.int64}


def _frozen(options: dict) -> str:
    return json.dumps(options, sort_keys=True, default=str)


@lru_cache(maxsize=128)
def _schedule(algorithm: str, workers: int, elements: int, dtype: str, frozen_options: str):
    options = json.loads(frozen_options)
    return algorithms.build(algorithm, workers, elements, dtype=dtype if dtype in ("float32", "float64") else None,
                            **options)


def _pick(tensor: torch.Tensor, workers: int) -> tuple[str, dict]:
    """``algorithm="auto"``: the least predicted time on the calibrated topology, if any."""
    from ..topology import preset, resolve
    from ..tune import choose

    path = os.environ.get("GRADSYNC_TOPOLOGY")
    topology = resolve(path, workers) if path else preset("ethernet", workers=workers)
    picked = choose(topology, tensor.numel() * tensor.element_size(), tensor.element_size())
    return picked.algorithm, picked.kwargs()


def _agree(transport, description: dict, deadline: float) -> None:
    """All ranks check, before any data moves, that they run the same collective (over any
    transport with ``gather``: fixed-size bytes, never pickled objects)."""
    text = json.dumps(description, sort_keys=True)
    digest = torch.frombuffer(bytearray(hashlib.blake2b(text.encode(), digest_size=_SIGNATURE_BYTES).digest()),
                              dtype=torch.uint8)
    digests = transport.gather(digest, deadline)
    if len({d.numpy().tobytes() for d in digests}) == 1:
        return
    raw = bytearray(text.encode()[:_DESCRIPTION_BYTES].ljust(_DESCRIPTION_BYTES, b" "))
    texts = [bytes(t.tolist()).decode(errors="replace").strip()
             for t in transport.gather(torch.frombuffer(raw, dtype=torch.uint8), deadline, tag=1)]
    seen = [json.loads(t) if t.endswith("}") else {"description": t} for t in texts]
    diffs = []
    for key in sorted(set().union(*seen)):
        values = [s.get(key) for s in seen]
        if any(v != values[0] for v in values):
            groups = {}
            for r, v in enumerate(values):
                groups.setdefault(json.dumps(v), []).append(r)
            diffs.append(f"{key}: " + "; ".join(f"rank(s) {ranks} have {v}" for v, ranks in groups.items()))
    raise MismatchError(f"rank {transport.rank}: ranks disagree on the collective, nothing was sent: "
                        + " | ".join(diffs))


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum", group=None,
               timeout: float | None = None, check: bool = True, stall_warning: float | None = None,
               check_finite: bool = False, **options) -> torch.Tensor:
    """All-reduce ``tensor`` in place across ``group`` with a gradsync algorithm; return it.

    Like ``torch.distributed.all_reduce``: every rank calls it with a tensor of the same shape
    and dtype. ``algorithm`` is a registry name or "auto"; ``options`` go to the algorithm
    (``components=16`` for CERAR). Before any data moves the ranks agree on shape, dtype,
    algorithm and options (``check``); a mismatch raises ``MismatchError`` on every rank. A
    peer that fails or stalls raises ``PeerError`` within ``timeout`` seconds, on every rank,
    naming the rank that failed; ``stall_warning`` seconds logs a warning naming the peer
    still awaited (a straggler) before that. ``check_finite`` adds to the agreement whether
    each rank's tensor is free of NaN and Inf: if one is not, every rank raises
    ``MismatchError`` naming it, before anything is summed (off by default: it reads the
    tensor once more).

    Example, in each of N processes after ``dist.init_process_group("gloo", ...)``::

        grad = torch.ones(1000)
        gradsync.all_reduce(grad, algorithm="halving_doubling", op="avg")
    """
    timeout = check_call(tensor, op, timeout)
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first "
                          "(or use gradsync.runtime.launch)")
    if stall_warning is not None and not (isinstance(stall_warning, (int, float)) and 0 < stall_warning):
        raise ConfigError(f"stall_warning must be a positive number of seconds, got {stall_warning!r}")
    deadline = time.monotonic() + timeout
    transport = TorchTransport(group, stall_warning)
    try:
        return run_all_reduce(tensor, algorithm, op, transport, deadline, check, check_finite, options)
    finally:
        transport.close()


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


def run_all_reduce(tensor, algorithm, op, transport, deadline, check, check_finite, options):
    """The engine-independent part: agree, look the schedule up, execute, average, copy back."""
    workers = transport.size
    if algorithm == "auto":
        algorithm, picked = _pick(tensor, workers)
        options = {**picked, **options}
    dtype = str(tensor.dtype).removeprefix("torch.")
    if algorithm == "cerar" and dtype not in ("float32", "float64"):
        raise ConfigError(f"algorithm 'cerar' needs float32 or float64 tensors, got {dtype}")
    if check or check_finite:
        description = {"shape": list(tensor.shape), "dtype": dtype, "algorithm": algorithm, "op": op,
                       "options": json.loads(_frozen(options)), "device": tensor.device.type}
        if check_finite:
            description["finite"] = bool(torch.isfinite(tensor).all()) if tensor.is_floating_point() else True
        _agree(transport, description, deadline)
    if workers == 1:
        return tensor
    schedule = _schedule(algorithm, workers, tensor.numel(), dtype, _frozen(options))
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    result = execute(schedule, flat, transport, deadline)
    if op == "avg":
        result.div_(workers)
    if result.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(result.view(tensor.shape))
    return tensor
