"""Compact forms by algorithm name: the modules that define ``compact(workers, elements,
**options)`` (ring, sharded, host, hierarchical, halving_doubling on 2^k workers) give one
where their rule holds.

>>> build("ring", 4, 100).transfer_count, build("tree", 4, 100)
(24, None)
"""

from __future__ import annotations

import importlib

from . import get


def build(name: str, workers: int, elements: int, **options):
    """Algorithm ``name``'s compact schedule for these options (checked as ``algorithms.build``
    checks them), or None where it has none: ``build("hierarchical", 8, 64, local_size=4)``."""
    spec = get(name)
    spec.check_options(options)
    make = getattr(importlib.import_module(spec.schedule.__module__), "compact", None)
    return make(workers, elements, **options) if make is not None else None
