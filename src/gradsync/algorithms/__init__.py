"""The registry of all-reduce algorithms: one module each, listed here.

Every module exposes ``schedule(workers, elements, **options) -> Schedule`` and
``cost(workers, nbytes, net, itemsize=4, **options) -> float`` (its closed form). Adding an
algorithm is one new module plus one line in ``REGISTRY``.
"""

import inspect
from types import ModuleType

import numpy as np

from ..errors import ConfigError
from . import central, cerar, halving_doubling, host, ring, sharded, tree

REGISTRY: dict[str, ModuleType] = {
    "central": central,
    "host": host,
    "sharded": sharded,
    "ring": ring,
    "tree": tree,
    "halving_doubling": halving_doubling,
    "cerar": cerar,
}
EXACT = ("central", "host", "sharded", "ring", "tree", "halving_doubling")
APPROXIMATE = ("cerar",)


def get(name: str) -> ModuleType:
    """Return the module of algorithm ``name``: ``get("ring").schedule(4, 100)``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown algorithm {name!r}: expected one of "
                          f"{', '.join(REGISTRY)}") from None


def build(name: str, workers: int, elements: int, dtype=None, **options):
    """Build algorithm ``name``'s schedule: ``build("tree", 5, 100, segments=4)``.

    ``dtype`` reaches the algorithms whose schedule depends on it (CERAR's design) and is
    ignored by the others.
    """
    module = get(name)
    if dtype is not None and "dtype" in inspect.signature(module.schedule).parameters:
        options["dtype"] = np.dtype(dtype).name
    try:
        return module.schedule(workers, elements, **options)
    except TypeError as exc:
        raise ConfigError(f"bad option for algorithm {name!r}: {exc}") from None
