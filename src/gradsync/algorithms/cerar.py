"""CERAR: coded approximate ring all-reduce (Munim and Ramamoorthy), as a schedule.

Each worker's gradient is split into c components of m = ceil(d/c) elements; in each of the
L = c + N - 2 rounds every worker sends one coded packet of m elements to its successor. The
packets' contents belong to the codec ``gradsync.coding.cerar`` named in the schedule; its
linear encode (round 0) and decode (round L) products are charged as compute multiply-adds,
and each received packet as one add (forward it plus the worker's own update).

Normalized communication (c + N - 2)/c against ring's 2(N - 1)/N; storage (c + N)/c.
Exact for c <= N (the roots-of-unity construction); approximate beyond, with the error and
cond(M) of the chosen construction. By default the construction, eps and decode scale are the
ones of least error for (N, c, dtype); a design whose error (predicted, and checked on random
gradients) exceeds ``max_error`` is refused with a ConfigError naming the largest c that
meets it: cond(M) grows like eps^-r with r = ceil(c/N) - 1, so c far above N cannot be kept
accurate.

Cost: L (alpha + m s beta + m gamma) + (L c m + 2 c^2 m) mu, s bytes per element; gamma per
add, mu per multiply-add of the encode and decode products.
"""

# For learners (the live view's panel): what, why, cost, when it wins.
EXPLANATION = """\
Coded approximate ring all-reduce (the CERAR paper by Munim and Ramamoorthy): each worker
encodes its gradient into c components and passes one coded packet per round around the
ring for c + N - 2 rounds; a final decode recovers the sum. With c > N it sends less than
the exact ring's lower bound, (c + N - 2)/c of the buffer against 2 (N - 1)/N, at the price
of a numerical error that grows with c / N. The design's predicted error is shown: above
1e-2 gradsync refuses the design. It wins on slow links when a small, bounded error in the
gradient is acceptable."""


import numpy as np

from ..coding import cerar as codec   # its designs load scipy on first use, not here
from ..errors import ConfigError
from ..core.schedule import CODED, COMPUTE_DTYPE, Schedule, transfers
from ._common import Net, check_size
from .spec import AlgorithmSpec, Option, is_int, is_number, one_of

FLOATS = ("float16", "float32", "float64")   # the dtypes its codec designs for


def _components(workers, components):
    if components is None:
        return 2 * workers
    if isinstance(components, bool) or not isinstance(components, (int, np.integer)) or components < 1:
        raise ConfigError(f"components must be an integer >= 1, got {components!r}")
    return int(components)


def schedule(workers: int, elements: int, components: int | None = None, eps: float | None = None,
             max_cond: float | None = None, construction: str | None = None, dtype: str = "float32",
             scale: str | None = None, max_error: float = codec.DEFAULT_MAX_ERROR) -> Schedule:
    """Build CERAR's schedule with c = ``components`` (default 2N) and the named construction
    (default: the best for N, c and ``dtype``); refuse (ConfigError) a design whose relative
    error in ``dtype`` would exceed ``max_error``.

    >>> s = schedule(4, 800, components=8, eps=1e-3)
    >>> s.elements_sent().tolist()
    [1000, 1000, 1000, 1000]
    >>> schedule(2, 1000, components=16)
    Traceback (most recent call last):
    ...
    gradsync.errors.ConfigError: CERAR with N = 2 workers and c = 16 components predicts a relative error of ...
    """
    workers, elements = check_size(workers, elements)
    c = _components(workers, components)
    if workers == 1:   # nothing to reduce
        return Schedule("cerar", 1, elements, transfers(0, 0, 0, 0, 0, CODED), options={"components": c})
    design = codec.make(workers, c, construction, eps=eps, max_cond=max_cond, dtype=dtype, scale=scale,
                        max_error=max_error)
    m = -(-elements // c)
    rounds = design.rounds
    node = np.arange(workers)
    table = transfers(np.arange(1, rounds + 1)[:, None], node, (node + 1) % workers, 0, m, CODED)
    compute = np.zeros(2 * workers if m else 0, COMPUTE_DTYPE)
    if m:
        compute["round"] = np.repeat([0, rounds], workers)
        compute["node"] = np.tile(node, 2)
        compute["madds"][:workers] = rounds * c * m              # round 0: encode all rounds
        compute["madds"][-workers:] = 2 * c * c * m              # round L: decode
    options = {"components": c, "construction": design.construction, "eps": design.eps,
               "scale": design.scale, "dtype": dtype}
    return Schedule("cerar", workers, elements, table, compute=compute, options=options,
                    codec=design.to_dict())


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, components=None, **options) -> float:
    """Closed-form time on a switch: ``cost(4, 8e6, Net(0, 1e-9), components=8)`` is 10 rounds of 250 us."""
    if workers == 1:
        return 0.0
    c = _components(workers, components)
    rounds = c + workers - 2
    m = -(-int(nbytes // itemsize) // c)
    return rounds * (net.alpha + m * itemsize * net.beta + m * net.gamma) + (rounds * c + 2 * c * c) * m * net.mu


SPEC = AlgorithmSpec(
    name="cerar", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"coded": "coded ring pass"}, exact=False,
    summary="coded approximate ring all-reduce: fewer rounds and bytes, a bounded error",
    dtypes=FLOATS,
    options={"components": Option(None, "an integer >= 1", is_int(1)),
             "eps": Option(None, "a number in (0, 1)", is_number(0, 1)),
             "max_cond": Option(None, "a number in (1, 1e15)", is_number(1, 1e15)),
             "construction": Option(None, f"one of {', '.join(codec.CONSTRUCTIONS)}", one_of(*codec.CONSTRUCTIONS)),
             "max_error": Option(codec.DEFAULT_MAX_ERROR,
                                 "a number > 0 (the relative error above which a design is "
                                 "refused), or None to build it unchecked",
                                 lambda v: v is None or is_number(0)(v)),
             "dtype": Option("float32", "float16, float32 or float64", one_of(*FLOATS)),
             "scale": Option(None, f"one of {', '.join(codec.SCALES)}", one_of(*codec.SCALES))})
