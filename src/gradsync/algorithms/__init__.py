"""The registry of all-reduce algorithms: one module each, ending in its own ``SPEC``.

Every module exposes ``schedule(workers, elements, **options) -> Schedule`` and
``cost(workers, nbytes, net, itemsize=4, **options) -> float`` (its closed form), and ends in
``SPEC = AlgorithmSpec(...)``. The registry finds the modules of this package on import, so
adding an algorithm is one new module; the command line, the web view, the tuner and the
runtime all read the registry. Algorithms from users' own code join with ``register``.

>>> names(exact=False)
('cerar',)
"""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np

from .. import dtypes
from ..errors import ConfigError
# Re-exported: users write their own specs with these (``from gradsync.algorithms import Option``).
from .spec import AlgorithmSpec, Option, is_int, is_number, one_of  # noqa: F401

# The order the built-ins are shown in (`gradsync list`, tune's tables, the web view's menu, the
# README's table): simplest first. Modules found beyond these follow them, by name.
SHOWN_FIRST = ("central", "host", "sharded", "one_shot", "ring", "tree", "halving_doubling", "hierarchical", "cerar")

REGISTRY: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to the registry; refuse a taken name or a malformed spec (ConfigError).

    Register at import time of the module that defines the algorithm, or at least define the
    spec at that module's top level: ``gradsync bench`` re-imports the module in each worker
    process (see ``load_external``).

    >>> from gradsync.algorithms import ring
    >>> spec = register(AlgorithmSpec(name="ring_again", schedule=ring.schedule, cost=ring.cost,
    ...                               exact=True, summary="ring all-reduce, once more"))
    >>> "ring_again" in names(exact=True)
    True
    >>> unregister("ring_again")
    """
    if not isinstance(spec, AlgorithmSpec):
        raise ConfigError(f"register takes an AlgorithmSpec, got {type(spec).__name__}")
    problems = spec.problems()
    if problems:
        raise ConfigError(f"cannot register algorithm {spec.name!r}: {'; '.join(problems)}")
    if spec.name in REGISTRY:
        raise ConfigError(f"cannot register algorithm {spec.name!r}: the name is taken "
                          f"(by {REGISTRY[spec.name].schedule.__module__})")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove algorithm ``name`` from the registry: ``unregister("ring_again")``."""
    get(name)
    del REGISTRY[name]


def names(exact: bool | None = None) -> tuple[str, ...]:
    """The registered names, now (later registrations included): all, or only the exact
    (``exact=True``) or approximate ones. ``names(exact=True)[:2]`` is ``('central', 'host')``."""
    return tuple(n for n, s in REGISTRY.items() if exact is None or s.exact == exact)


def __getattr__(attr):
    # EXACT and APPROXIMATE are computed on each access, so that `algorithms.EXACT` includes
    # algorithms registered after import; `from ... import EXACT` still takes a snapshot.
    if attr in ("EXACT", "APPROXIMATE"):
        return names(exact=attr == "EXACT")
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def get(name: str) -> AlgorithmSpec:
    """Return the spec of algorithm ``name``: ``get("ring").schedule(4, 100)``."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown algorithm {name!r}: expected one of {', '.join(REGISTRY)}") from None


def build(name: str, workers: int, elements: int, dtype=None, **options):
    """Build algorithm ``name``'s schedule: ``build("tree", 5, 100, segments=4)``.

    ``dtype`` is checked against the algorithm's dtypes and reaches the algorithms whose
    schedule depends on it (CERAR's design); the others ignore it.
    """
    spec = get(name)
    if dtype is not None:
        dtype = _dtype_name(dtype)
        spec.check_dtype(dtype)
        if "dtype" in spec.options:
            options["dtype"] = dtype
    spec.check_options(options)
    return spec.schedule(workers, elements, **options)


def _dtype_name(dtype) -> str:
    """The name of a dtype given as a name or numpy dtype: ``_dtype_name(np.float32) == "float32"``."""
    if isinstance(dtype, str) and dtype in dtypes.names():   # bfloat16 too, which numpy does not know
        return dtype
    try:
        return np.dtype(dtype).name
    except (TypeError, ValueError):
        raise ConfigError(f"dtype must be a dtype or its name, like float32, got {dtype!r}") from None


def external() -> list[tuple[str, str]]:
    """(module, name) of each algorithm registered from outside gradsync, for worker processes.

    >>> external()
    []
    """
    return [(s.schedule.__module__, s.name) for s in REGISTRY.values()
            if not s.schedule.__module__.startswith("gradsync.")]


def load_external(pairs) -> None:
    """In a fresh process, register the ``external()`` algorithms of the parent process:
    import each module, and register the spec it defines at top level if importing it did not.
    ``load_external([("my_algorithms", "pairwise")])`` is what each bench worker runs first."""
    for module_name, name in pairs:
        if name in REGISTRY:
            continue
        module = importlib.import_module(module_name)
        if name not in REGISTRY:
            found = [v for v in vars(module).values() if isinstance(v, AlgorithmSpec) and v.name == name]
            if not found:
                raise ConfigError(f"algorithm {name!r}: module {module_name} neither registers it on import "
                                  f"nor defines its AlgorithmSpec at top level, so worker processes cannot")
            register(found[0])


def algorithm_modules() -> list[str]:
    """The modules of this package that may hold an algorithm (not ``spec``, not ``_private``
    ones), in the order they are shown: ``algorithm_modules()[:2]`` is ['central', 'host']."""
    found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name != "spec"}
    return [n for n in SHOWN_FIRST if n in found] + sorted(found - set(SHOWN_FIRST))


def _register_built_ins() -> None:
    # Imported by name, not listed in an import statement: a new module is found without
    # editing this file. A module without a SPEC (a helper) is imported and skipped.
    for module_name in algorithm_modules():
        spec = getattr(importlib.import_module(f"{__name__}.{module_name}"), "SPEC", None)
        if isinstance(spec, AlgorithmSpec):
            register(spec)


_register_built_ins()
