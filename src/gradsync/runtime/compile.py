"""Choosing and compiling a collective, cached by value: what ``all_reduce`` runs, decided
once per shape in a training loop.

``pick`` is ``algorithm="auto"``: the least predicted time on the calibrated topology in
GRADSYNC_TOPOLOGY or the ethernet preset. ``compiled`` builds the algorithm's schedule and
compiles this rank's plan (and the codec's design, for coded schedules).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import NamedTuple

from .. import algorithms, coding, dtypes
from ..core.plan import Plan, compile_plan
from ..core.schedule import CODED, COPY, REDUCE, Schedule

PLAN_CACHE = 64


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
    design = None if schedule.codec is None else coding.design(schedule.codec)
    return Compiled(schedule, compile_plan(schedule, rank, dtypes.itemsize(dtype), ops), design)


def pick(tensor, workers: int) -> tuple[str, dict]:
    """``algorithm="auto"``: the least predicted time on the topology in GRADSYNC_TOPOLOGY (a
    calibrated file, read at each call) or the ethernet preset; cached by the topology's value
    and the size.

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
