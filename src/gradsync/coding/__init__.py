"""Codecs for schedules whose transfers carry encoded packets (op CODED).

A coded schedule names its codec and parameters in ``schedule.codec``; the codec knows what
each packet holds. The schedule still says who sends how much to whom in which round, so the
simulator and the visualizer treat it like any other.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ScheduleError
from . import cerar

CODECS = {"cerar": cerar}


def get(codec: dict):
    """The codec module named by a schedule's ``codec`` dict."""
    try:
        return CODECS[codec["name"]]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}") from None


def emulate(schedule, inputs: np.ndarray) -> np.ndarray:
    """Run a coded schedule on ``inputs`` (one row per worker); return each worker's result."""
    return get(schedule.codec).emulate_schedule(schedule, inputs)


def verify(schedule) -> None:
    """Check a coded schedule's structure against its codec; raise ScheduleError if off."""
    try:
        get(schedule.codec).verify_schedule(schedule)
    except ConfigError as exc:
        raise ScheduleError(str(exc)) from None
