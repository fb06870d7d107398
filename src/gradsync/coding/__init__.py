"""Coding: schedules whose transfers carry coded packets (op CODED), and the registry of their codecs.

Two words kept apart. **Coding** (this package) is what a schedule's coded packets hold:
CERAR's workers send linear combinations of their components, round by round, and each
decodes the sum at the end; the coding is the algorithm. **Compression**
(``gradsync.compression``) is the lossy gradient codecs (fp16, bf16, PowerSGD, top-k, sign):
each worker's gradient is compressed, an exact schedule moves the payload, and the sum is
decompressed. Both registries call their entries codecs; here a codec is a coding one,
``CODECS`` holds them by the name a schedule's ``codec`` dict gives.

A coded schedule names its codec and parameters in ``schedule.codec``; the codec knows what
each packet holds. The schedule still says who sends how much to whom in which round, so the
simulator and the visualizer treat it like any other, and the runtime drives the codec
through the calls below without knowing which one it is. Every codec module provides them
under the same names: ``design(codec)``, ``worker(design, rank, flat)``,
``emulate_schedule(schedule, inputs)`` and ``verify_schedule(schedule)``, and its designs carry
``name``, their key in ``CODECS``. A second codec is one more entry.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ScheduleError
from . import cerar

CODECS = {"cerar": cerar}


def get(codec: dict):
    """The codec module named by a schedule's ``codec`` dict.

    >>> get({"name": "cerar"}).__name__
    'gradsync.coding.cerar'
    """
    try:
        return CODECS[codec["name"]]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}") from None


def design(codec: dict):
    """The design object of a schedule's ``codec`` dict: what ``worker`` takes.

    >>> design(cerar.unity(4, 6, 1e-3).to_dict()).rounds
    8
    """
    return get(codec).design(codec)


def worker(design, rank: int, flat):
    """Rank ``rank``'s side of a coded all-reduce of ``flat`` (a numpy array or a torch tensor).

    The runtime's collective drives it: ``receive(t)`` is the buffer round t's packet lands in,
    ``received(t)`` says it has landed, ``packet(t, lo, hi)`` is the piece ``lo:hi`` of what to
    send in round t, and ``result()`` decodes the sum.

    >>> w = worker(cerar.unity(2, 2), 0, np.arange(4.0))
    >>> w.packet(1, 0, 2).shape
    (2,)
    """
    return CODECS[design.name].worker(design, rank, flat)


def emulate(schedule, inputs: np.ndarray) -> np.ndarray:
    """Run a coded schedule on ``inputs`` (one row per worker); return each worker's result.

    >>> import gradsync
    >>> s = gradsync.schedule("cerar", 4, 10, components=4)
    >>> bool(np.allclose(emulate(s, np.ones((4, 10)))[0], 4))
    True
    """
    return get(schedule.codec).emulate_schedule(schedule, inputs)


def verify(schedule) -> None:
    """Check a coded schedule's structure against its codec; raise ScheduleError if off.

    >>> import gradsync
    >>> verify(gradsync.schedule("cerar", 4, 10, components=4))
    """
    try:
        get(schedule.codec).verify_schedule(schedule)
    except ConfigError as exc:
        raise ScheduleError(str(exc)) from None
