"""An all-reduce call, checked whole before anything is posted: the boundary of the runtime.

``Request.checked`` takes what a caller passes (``gradsync.all_reduce``'s arguments) and raises
``ConfigError`` naming the first bad value: the tensor and its dtype, op, timeout,
stall_warning, the algorithm (known, taking this dtype, these options), the compression codec
and the transport choice. Nothing touches a transport or a store before it returns, so a typo
costs no rendezvous.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import algorithms, dtypes
from ..errors import ConfigError
from .transport import check_choice

OPS = ("sum", "avg")
DEFAULT_TIMEOUT = 60.0          # seconds, unless GRADSYNC_TIMEOUT says otherwise


def default_timeout() -> float:
    """The timeout of a call that gives none: GRADSYNC_TIMEOUT (read now), else 60 s."""
    return float(os.environ.get("GRADSYNC_TIMEOUT", DEFAULT_TIMEOUT))


@dataclass(frozen=True)
class Request:
    """One checked all-reduce call; ``Request.checked(...)`` makes it.

    Example: ``Request.checked(torch.ones(4), "ring", op="avg").timeout`` is 60.0 by default.
    """

    tensor: torch.Tensor
    algorithm: str
    op: str
    timeout: float
    options: dict = field(default_factory=dict)
    check: bool = True
    check_finite: bool = False
    trace: object = None
    stall_warning: float | None = None
    transport: str = "auto"
    codec: object = None             # a gradsync.compression Codec, or None
    compression_key: object = None

    @property
    def dtype(self) -> str:
        return str(self.tensor.dtype).removeprefix("torch.")

    @classmethod
    def checked(cls, tensor, algorithm: str = "ring", op: str = "sum", timeout=None, *, options=None,
                check: bool = True, check_finite: bool = False, trace=None, stall_warning=None,
                transport: str | None = None, compression=None, compression_key=None) -> "Request":
        """Check every argument; return the request. ``transport`` None: the caller brings its own."""
        timeout = check_call(tensor, op, timeout)
        if stall_warning is not None and not (isinstance(stall_warning, (int, float)) and 0 < stall_warning):
            raise ConfigError(f"stall_warning must be a positive number of seconds, got {stall_warning!r}")
        options = dict(options or {})
        codec = None if compression is None else compression_codec(tensor, algorithm, compression)
        if codec is None and algorithm != "auto":
            spec = algorithms.get(algorithm)
            spec.check_dtype(str(tensor.dtype).removeprefix("torch."))
            spec.check_options(options)
        if transport is not None:
            check_choice(transport, tensor.device.type, stall_warning)
        return cls(tensor, algorithm, op, timeout, options, check, check_finite, trace, stall_warning,
                   transport or "", codec, compression_key)


def check_call(tensor, op: str, timeout) -> float:
    """Validate what every engine's all_reduce takes; return the timeout in seconds.

    >>> check_call(torch.ones(2), "sum", 5)
    5.0
    """
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if str(tensor.dtype).removeprefix("torch.") not in dtypes.names():
        raise ConfigError(f"dtype {tensor.dtype} is not supported: expected a float or integer type")
    if op not in OPS:
        raise ConfigError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ConfigError(f"op 'avg' needs a float tensor, got {tensor.dtype}")
    timeout = default_timeout() if timeout is None else timeout
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < 1e7:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def compression_codec(tensor, algorithm: str, compression):
    """The codec of ``all_reduce(..., compression=...)``, checked before anything is posted:
    ``compression_codec(torch.ones(4), "ring", "fp16").label`` is 'fp16'."""
    from .. import compression as codecs

    codec = codecs.make(compression)
    if not tensor.is_floating_point():
        raise ConfigError(f"compression {codec.label!r} needs a float tensor, got {tensor.dtype}")
    if algorithm != "auto":
        algorithms.get(algorithm)
    return codec


def check_initialized() -> None:
    """ConfigError unless torch.distributed is initialized (all_reduce runs on its groups)."""
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first "
                          "(or use gradsync.tools.launch)")
