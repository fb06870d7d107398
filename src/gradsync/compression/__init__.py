"""Gradient compression as a layer over any exact schedule: fp16, bf16, powersgd, topk, sign.

A codec compresses each worker's gradient, runs exact collectives of the compressed payload
with the schedule chosen (ring, tree, ...; all-gathers on the ring's all-gather half), and
writes back the decompressed sum. Name one as text, ``"powersgd:rank=4"`` or
``"topk:ratio=0.01"``, wherever an algorithm is chosen:

>>> make("powersgd:rank=4").label
'powersgd:rank=4'
>>> make("topk", ratio=2)
Traceback (most recent call last):
...
gradsync.errors.ConfigError: compression 'topk': option ratio must be a number in (0, 1], got 2
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..algorithms.spec import Option, is_int, is_number
from ..errors import ConfigError
from . import bf16, fp16, powersgd, sign, topk
from .base import Codec, Exchange, Wire

_FEEDBACK = Option(True, "true or false", lambda v: isinstance(v, bool))


@dataclass(frozen=True)
class CodecSpec:
    """One registry entry: the codec's class, a summary and its options (name -> Option)."""

    name: str
    codec: type
    summary: str
    options: dict = field(default_factory=dict)


REGISTRY: dict[str, CodecSpec] = {}


def register(spec: CodecSpec) -> CodecSpec:
    """Add a codec to the registry (``make`` and the CLI then know it); refuse a taken name
    (ConfigError naming the module of the codec that holds it), as ``algorithms.register`` does.

    >>> register(CodecSpec("sign", sign.Sign, "a second sign"))
    Traceback (most recent call last):
    ...
    gradsync.errors.ConfigError: cannot register compression 'sign': the name is taken (by gradsync.compression.sign)
    """
    if spec.name in REGISTRY:
        raise ConfigError(f"cannot register compression {spec.name!r}: the name is taken "
                          f"(by {REGISTRY[spec.name].codec.__module__})")
    REGISTRY[spec.name] = spec
    return spec


for _spec in (
    CodecSpec("fp16", fp16.Fp16, fp16.SUMMARY),
    CodecSpec("bf16", bf16.Bf16, bf16.SUMMARY),
    CodecSpec("powersgd", powersgd.PowerSgd, powersgd.SUMMARY,
              {"rank": Option(1, "an integer >= 1", is_int(1)), "error_feedback": _FEEDBACK,
               "seed": Option(0, "an integer >= 0", is_int(0))}),
    CodecSpec("topk", topk.TopK, topk.SUMMARY,
              {"ratio": Option(0.01, "a number in (0, 1]", lambda v: is_number(0, 1)(v) or v == 1),
               "error_feedback": _FEEDBACK}),
    CodecSpec("sign", sign.Sign, sign.SUMMARY, {"error_feedback": _FEEDBACK}),
):
    register(_spec)


def names() -> list[str]:
    """The registered codecs: ``names()[:2]`` is ['fp16', 'bf16']."""
    return list(REGISTRY)


def _value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(low)
        except ValueError:
            pass
    return text.strip()


def parse(text: str) -> tuple[str, dict]:
    """``"name:key=value,key=value"`` to (name, options): ``parse("topk:ratio=0.05")`` is
    ('topk', {'ratio': 0.05})."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"compression must be a codec name like 'fp16' or 'powersgd:rank=4', got {text!r}")
    name, _, rest = text.strip().partition(":")
    options = {}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"compression {text!r}: expected key=value after ':', got {pair!r}")
        options[key.strip()] = _value(value)
    return name.strip(), options


def make(compression, **options) -> Codec:
    """A codec from its text (``"powersgd:rank=4"``), name and options, or a ``Codec`` (returned
    as is). Each call makes a new codec with its own state: keep it to keep error feedback.

    >>> make("sign").label, make("fp16").exact
    ('sign', False)
    """
    if isinstance(compression, Codec):
        if options:
            raise ConfigError(f"options {sorted(options)} given with an already made codec {compression.label}")
        return compression
    name, given = parse(compression)
    given.update(options)
    if name not in REGISTRY:
        raise ConfigError(f"unknown compression {name!r}: expected one of {', '.join(REGISTRY)}")
    spec = REGISTRY[name]
    for key, value in given.items():
        if key not in spec.options:
            takes = ", ".join(spec.options) or "no options"
            raise ConfigError(f"compression {name!r}: unknown option {key!r} (it takes {takes})")
        if not spec.options[key].valid(value):
            raise ConfigError(f"compression {name!r}: option {key} must be {spec.options[key].expected}, "
                              f"got {value!r}")
    return spec.codec(**given)


__all__ = ["Codec", "CodecSpec", "Exchange", "Wire", "REGISTRY", "make", "names", "parse", "register"]
