"""The registry of all-reduce algorithms: one module each, one ``AlgorithmSpec`` each here.

Every module exposes ``schedule(workers, elements, **options) -> Schedule`` and
``cost(workers, nbytes, net, itemsize=4, **options) -> float`` (its closed form). Adding an
algorithm is one new module plus one ``register`` call; the command line, the web view, the
tuner and the runtime all read the registry.

>>> names(exact=False)
('cerar',)
"""

from __future__ import annotations

import importlib

import numpy as np

from ..coding import cerar as cerar_codec
from ..errors import ConfigError
from . import central, cerar, halving_doubling, hierarchical, host, ring, sharded, tree
from .spec import DTYPES, AlgorithmSpec, Option, is_int, is_number, one_of

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
    if isinstance(dtype, str) and dtype in DTYPES:          # bfloat16 too, which numpy does not know
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


def _is_rings(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in value)


def _is_weights(value) -> bool:
    return isinstance(value, (list, tuple)) and all(map(is_number(0), value))


for _spec in (
    AlgorithmSpec(name="central", schedule=central.schedule, cost=central.cost,
                  explanation=central.EXPLANATION, phases={"reduce": "reduce to the root", "copy": "broadcast from the root"}, exact=True,
                  summary="every worker sends to one root worker, which sums and sends the sum back",
                  options={"root": Option(0, "a worker index (an integer >= 0)", is_int(0))}),
    AlgorithmSpec(name="host", schedule=host.schedule, cost=host.cost,
                  explanation=host.EXPLANATION, phases={"reduce": "reduce on the host", "copy": "broadcast from the host"}, exact=True,
                  summary="every worker sends to the host CPU, which sums and sends the sum back"),
    AlgorithmSpec(name="sharded", schedule=sharded.schedule, cost=sharded.cost,
                  explanation=sharded.EXPLANATION, phases={"reduce": "reduce-scatter", "copy": "all-gather"}, exact=True,
                  summary="each worker owns 1/N of the buffer: direct reduce-scatter, then all-gather"),
    AlgorithmSpec(name="ring", schedule=ring.schedule, cost=ring.cost,
                  explanation=ring.EXPLANATION, phases={"reduce": "reduce-scatter", "copy": "all-gather"}, exact=True,
                  summary="reduce-scatter then all-gather around one ring, or several at once",
                  options={"rings": Option(None, "a list of worker orders, e.g. [[0, 1, 2, 3]]", _is_rings),
                           "weights": Option(None, "a list of positive numbers, one per ring", _is_weights)}),
    AlgorithmSpec(name="tree", schedule=tree.schedule, cost=tree.cost,
                  explanation=tree.EXPLANATION, phases={"reduce": "reduce up the tree", "copy": "broadcast down the tree"}, exact=True,
                  summary="pipelined reduce up a binary tree, then broadcast down it",
                  options={"segments": Option(None, "an integer >= 1", is_int(1))}),
    AlgorithmSpec(name="halving_doubling", schedule=halving_doubling.schedule, cost=halving_doubling.cost,
                  explanation=halving_doubling.EXPLANATION, phases={"reduce": "recursive halving", "copy": "recursive doubling"},
                  exact=True, summary="recursive halving (reduce-scatter), then recursive doubling (all-gather)"),
    AlgorithmSpec(name="hierarchical", schedule=hierarchical.schedule, cost=hierarchical.cost,
                  explanation=hierarchical.EXPLANATION,
                  phases={"reduce": "reduce-scatter, then all-reduce across machines",
                          "copy": "all-gather"}, exact=True,
                  summary="reduce-scatter inside each machine, all-reduce across machines on rails, all-gather inside",
                  options={"local_size": Option(None, "an integer >= 1 that divides the workers (workers per machine)",
                                                is_int(1)),
                           "inter": Option("ring", f"one of {', '.join(hierarchical.INTERS)}",
                                           one_of(*hierarchical.INTERS))}),
    AlgorithmSpec(name="cerar", schedule=cerar.schedule, cost=cerar.cost,
                  explanation=cerar.EXPLANATION, phases={"coded": "coded ring pass"}, exact=False,
                  summary="coded approximate ring all-reduce: fewer rounds and bytes, a bounded error",
                  dtypes=("float16", "float32", "float64"),
                  options={"components": Option(None, "an integer >= 1", is_int(1)),
                           "eps": Option(None, "a number in (0, 1)", is_number(0, 1)),
                           "max_cond": Option(None, "a number in (1, 1e15)", is_number(1, 1e15)),
                           "construction": Option(None, f"one of {', '.join(cerar_codec.CONSTRUCTIONS)}",
                                                  one_of(*cerar_codec.CONSTRUCTIONS)),
                           "max_error": Option(cerar_codec.DEFAULT_MAX_ERROR,
                                               "a number > 0 (the relative error above which a design is "
                                               "refused), or None to build it unchecked",
                                               lambda v: v is None or is_number(0)(v)),
                           "dtype": Option("float32", "float16, float32 or float64",
                                           one_of("float16", "float32", "float64")),
                           "scale": Option(None, f"one of {', '.join(cerar_codec.SCALES)}",
                                           one_of(*cerar_codec.SCALES))}),
):
    register(_spec)
