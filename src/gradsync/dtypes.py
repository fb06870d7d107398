"""The element types gradsync knows, in one table: name, bytes per element, whether it is a
float. Everything that names a dtype reads it from here.

torch is not imported: the schedule, simulator and CLI work without it; ``torch_dtype``
imports it when asked.

>>> itemsize("bfloat16"), is_float("int32"), names(floats=True)[:2]
(2, False, ('float16', 'bfloat16'))
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ConfigError


class DType(NamedTuple):
    """One row of the table: ``DType("float32", 4, True)``."""

    name: str
    itemsize: int
    is_float: bool


TABLE = {d.name: d for d in (
    DType("float16", 2, True), DType("bfloat16", 2, True), DType("float32", 4, True), DType("float64", 8, True),
    DType("int8", 1, False), DType("uint8", 1, False), DType("int16", 2, False), DType("int32", 4, False),
    DType("int64", 8, False))}


def names(floats: bool | None = None) -> tuple[str, ...]:
    """The known dtype names, in the table's order; ``floats`` True or False keeps one kind:
    ``names(floats=False)[:2]`` is ('int8', 'uint8')."""
    return tuple(n for n, d in TABLE.items() if floats is None or d.is_float == floats)


def get(name) -> DType:
    """The table's entry for ``name`` (a name or a torch dtype); ConfigError naming the choices:
    ``get("torch.int32").itemsize`` is 4."""
    key = str(name).removeprefix("torch.")
    if key not in TABLE:
        raise ConfigError(f"unknown dtype {name!r}: expected one of {', '.join(TABLE)}")
    return TABLE[key]


def itemsize(name) -> int:
    """Bytes per element: ``itemsize("float32")`` is 4."""
    return get(name).itemsize


def is_float(name) -> bool:
    """Whether ``name`` is a floating-point type: ``is_float("bfloat16")`` is True."""
    return get(name).is_float


def torch_dtype(name):
    """The torch dtype of ``name``: ``torch_dtype("bfloat16")`` is ``torch.bfloat16``."""
    import torch

    return getattr(torch, get(name).name)
