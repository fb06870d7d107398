"""The registry of all-reduce algorithms: one module each, listed here.

Every module exposes ``schedule(workers, elements, **options) -> Schedule`` and
``cost(workers, nbytes, net, itemsize=4, **options) -> float`` (its closed form). Adding an
algorithm is one new module plus one line in ``REGISTRY``.
"""

from types import ModuleType

from ..errors import ConfigError
from . import central, halving_doubling, host, ring, sharded, tree

REGISTRY: dict[str, ModuleType] = {
    "central": central,
    "host": host,
    "sharded": sharded,
    "ring": ring,
    "tree": tree,
    "halving_doubling": halving_doubling,
}
EXACT = ("central", "host", "sharded", "ring", "tree", "halving_doubling")


def get(name: str) -> ModuleType:
    """Return the module of algorithm ``name``: ``get("ring").schedule(4, 100)``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown algorithm {name!r}: expected one of "
                          f"{', '.join(REGISTRY)}") from None


def build(name: str, workers: int, elements: int, **options):
    """Build algorithm ``name``'s schedule: ``build("tree", 5, 100, segments=4)``."""
    module = get(name)
    try:
        return module.schedule(workers, elements, **options)
    except TypeError as exc:
        raise ConfigError(f"bad option for algorithm {name!r}: {exc}") from None
