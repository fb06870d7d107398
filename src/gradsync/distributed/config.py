"""Which implementation each collective of the gradsync backend uses, per process.

A choice is "auto" (the default: a quick measurement of this machine decides per size between
gradsync's best schedule and the engine's own collective), "engine" (always the underlying
engine: Gloo on CPU), "one_host" (the shared-buffer collectives, every rank on one host), or
an algorithm of the registry that can give the collective (a ring reduce-scatter is the
ring's REDUCE half). Set it with ``configure`` (taking effect at every group's next call) or
the environment variable GRADSYNC_ALGORITHMS ("all_reduce=ring,reduce_scatter=sharded"), read
and checked when a group is created; a bad value is a ``ConfigError``, naming it and what is
allowed. ``transport`` says what the schedules' messages travel over: "gloo" (the engine's
send and receive), "shm" (shared memory; every rank of the group on one host) or "auto" (the
default: shared memory when the group's ranks share one host and can map a segment together,
else the engine's send and receive).

This module owns the process's choices (one dict, one entry per collective kind: bounded).
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache

from .. import algorithms
from ..errors import ConfigError

ENV = "GRADSYNC_ALGORITHMS"
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
SPECIAL = ("auto", "engine")
TRANSPORTS = ("auto", "gloo", "shm")    # what the schedules' messages travel over (see the module's text)
SETTINGS = KINDS + ("transport", "gradients")    # gradients: approximate gradient sync (``gradients``)
# which collective each algorithm's schedule can give, beyond the all-reduce every exact one is
PRODUCERS = {"reduce_scatter": "reduce_scatter", "all_gather": "all_gather", "broadcast": "broadcast"}
PROBE_WORKERS = (2, 4)       # an algorithm is accepted if its halves give the collective for some of these

_lock = threading.Lock()
_choices: dict[str, str] = {}        # kind -> choice, set by configure (the environment fills the rest)
VERSION = [0]                        # configure's calls so far: a group re-reads its choices when it moves
TRACE: list = [None]                 # the one gradsync.runtime.tracing.Trace the schedules record into, or None


def allowed(kind: str) -> tuple[str, ...]:
    """The choices ``kind`` takes: "auto", "engine" and the algorithms that give it.

    >>> "tree" in allowed("broadcast"), "ring" in allowed("broadcast"), allowed("all_gather")[:2]
    (True, False, ('auto', 'engine'))
    """
    if kind == "transport":
        return TRANSPORTS
    special = SPECIAL + (("one_host",) if one_host_available() else ())
    if kind == "barrier":
        return special
    if kind == "all_reduce":
        return special + tuple(sorted(algorithms.names(exact=True)))
    from ..runtime.halves import produces

    return special + tuple(sorted(a for a in algorithms.names(exact=True)
                                  if any(PRODUCERS[kind] in produces(a, n) for n in PROBE_WORKERS)))


@lru_cache(maxsize=1)
def one_host_available() -> bool:
    """Whether this gradsync has the shared-buffer collectives (``runtime.one_host``).

    >>> one_host_available() in (True, False)
    True
    """
    import importlib.util

    return importlib.util.find_spec("gradsync.runtime.one_host") is not None


def check(kind: str, choice) -> str:
    """``choice`` for ``kind``, or ConfigError naming both and what is allowed.

    >>> check("all_reduce", "ring")
    'ring'
    >>> check("all_gather", "tree")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    gradsync.errors.ConfigError: all_gather cannot run as 'tree': expected one of auto, engine, ...ring, sharded
    """
    if kind not in SETTINGS:
        raise ConfigError(f"unknown collective {kind!r}: expected one of {', '.join(KINDS)} (or transport, gradients)")
    if kind == "gradients":
        from .gradients import parse

        return parse(choice).text
    options = allowed(kind)
    if not isinstance(choice, str) or choice not in options:
        raise ConfigError(f"{kind} cannot run as {choice!r}: expected one of {', '.join(options)}")
    return choice


def parse(text: str) -> dict[str, str]:
    """GRADSYNC_ALGORITHMS' text as {kind: choice}, checked.

    >>> parse("all_reduce=ring, reduce_scatter=sharded")
    {'all_reduce': 'ring', 'reduce_scatter': 'sharded'}
    """
    return dict(_parsed(text))


@lru_cache(maxsize=8)
def _parsed(text: str) -> tuple:
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, choice = item.partition("=")
        if not sep:
            raise ConfigError(f"{ENV}: expected kind=choice items separated by commas, got {item!r}")
        out[kind.strip()] = check(kind.strip(), choice.strip())
    return tuple(out.items())


def configure(**choices) -> dict[str, str]:
    """Set this process's choices (kind=choice, or kind=None to go back to the default); return
    them all. Checked at once: a bad one changes nothing.

    Example::

        gradsync.distributed.configure(all_reduce="ring", reduce_scatter="sharded")
        gradsync.distributed.configure(all_reduce="engine")      # Gloo's own all_reduce
    """
    checked = {k: (None if v is None else check(k, v)) for k, v in choices.items()}
    if any(k not in SETTINGS for k in checked):
        check(next(k for k in checked if k not in SETTINGS), None)
    with _lock:
        for k, v in checked.items():
            if v is None:
                _choices.pop(k, None)
            else:
                _choices[k] = v
        VERSION[0] += 1
    return current()


def version() -> int:
    """How many times ``configure`` has changed the choices (a group caches them by it)."""
    return VERSION[0]


def trace(record=False):
    """The ``Trace`` every collective a schedule runs records into (None: none), or with
    ``record`` a Trace (or None) to set it: every rank sets one, or none, as with
    ``all_reduce(..., trace=)``. The engine's collectives are in the flight recorder only.

    Example: ``trace(Trace())`` in each rank, train a step, then ``trace().save(...)``.
    """
    if record is not False:
        if record is not None and not callable(getattr(record, "begin", None)):
            raise ConfigError(f"trace must be a gradsync.runtime.tracing.Trace or None, got {record!r}")
        TRACE[0] = record
    return TRACE[0]


def current() -> dict[str, str]:
    """Every kind's choice now: configure's, else GRADSYNC_ALGORITHMS' (read now), else "auto"
    (and the transport, "auto" by default).

    >>> current()["barrier"] in ("auto", "engine")
    True
    """
    from_env = dict(_parsed(os.environ.get(ENV, "")))
    with _lock:
        out = {k: _choices.get(k, from_env.get(k, "auto")) for k in KINDS}
        out["transport"] = _choices.get("transport", from_env.get("transport", "auto"))
        out["gradients"] = _choices.get("gradients") or _gradients_from_env()
        return out


def _gradients_from_env() -> str:
    """GRADSYNC_GRADIENTS, checked (a bad one is refused where the group is made)."""
    from .gradients import ENV as GRADIENTS, parse

    return parse(os.environ.get(GRADIENTS, "")).text
