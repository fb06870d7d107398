"""Choosing a CERAR design: the least predicted error in a dtype, or a refusal above a tolerance.

``best`` searches every construction for the design of least error in a dtype; ``make``
refuses (ConfigError) a design whose ``checked_error`` (the prediction, or a measurement if
worse) exceeds ``max_error``, naming ``largest_components``. The searches are cached by value
and run their linear algebra on one BLAS thread (``blas``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import scipy.optimize

from ...errors import ConfigError
from .blas import _one_blas_thread
from .limits import CONSTRUCTIONS, DEFAULT_MAX_ERROR, SCALES
from .designs import Design, _check, _check_dtype, _roots_upper, unity, vandermonde

_EPS_FLOOR, _EPS_TOP = 1e-12, 0.5
_GRID = 13               # log-spaced eps tried before refining: about one per factor 9
_CACHE = 512             # designs (and searches) kept per process, by value
_MAX_LAYERS = 16         # largest_components looks no further than c = 16 N


def _argmin_log(cost, lo: float, hi: float) -> float:
    """The x in [lo, hi] (a log eps) of least ``cost``: a coarse grid, then Brent between the
    grid neighbours of its best point. Where cond(M) nears 1 / u of float64 the cost is jagged
    noise far above its minimum, which the grid steps over and a local search alone would not."""
    grid = np.linspace(lo, hi, _GRID)
    values = [cost(x) for x in grid]
    i = int(np.argmin(values))
    res = scipy.optimize.minimize_scalar(cost, bounds=(grid[max(i - 1, 0)], grid[min(i + 1, _GRID - 1)]),
                                         method="bounded", options={"xatol": 1e-2})
    return float(res.x) if res.fun < values[i] else float(grid[i])


@lru_cache(maxsize=8 * _CACHE)
def _unity_cond(workers: int, components: int, eps: float) -> float:
    """cond(M) of the unity design (the scale does not change M), cached for the searches."""
    return unity(workers, components, eps).cond


def _unity_error(workers: int, components: int, eps: float, dtype: str, scale: str) -> float:
    design = unity(workers, components, eps, scale)
    design.__dict__["cond"] = _unity_cond(workers, components, eps)     # fills the cached_property
    return design.predicted_error(dtype)


@lru_cache(maxsize=_CACHE)
def _eps_of_least_cond(workers: int, components: int) -> float:
    """cond(M) of the unity design is U-shaped in eps: it falls as the layers separate, then
    rises as (1 + eps)^L unbalances the columns. Small eps (good accuracy) lie left of here."""
    with _one_blas_thread():
        x = _argmin_log(lambda x: np.log(_unity_cond(workers, components, float(np.exp(x)))),
                        np.log(_EPS_FLOOR), np.log(_EPS_TOP))
    return float(np.exp(x))


def unity_at_cond(workers: int, components: int, max_cond: float, scale: str = "none") -> Design:
    """The unity design with the smallest eps whose cond(M) stays within ``max_cond``.

    >>> unity_at_cond(8, 16, 1e3).cond <= 1e3
    True
    """
    _check_max_cond(max_cond)
    if components <= workers:
        return unity(workers, components, scale=scale)
    top = _eps_of_least_cond(workers, components)
    least = _unity_cond(workers, components, top)
    if least > max_cond:
        raise ConfigError(f"no unity design for N = {workers}, c = {components} has cond(M) <= {max_cond:g} "
                          f"(the least is {least:.3g}); raise max_cond or lower the components")

    def excess(x):                 # cond(M) falls with eps up to ``top``: one crossing
        return np.log(_unity_cond(workers, components, float(np.exp(x))) / max_cond)

    lo, hi = np.log(_EPS_FLOOR), np.log(top)
    if excess(lo) <= 0:
        return unity(workers, components, _EPS_FLOOR, scale)
    with _one_blas_thread():
        x = scipy.optimize.brentq(excess, lo, hi, xtol=1e-6) if excess(hi) < 0 else hi
    while excess(x) > 0:           # brentq's answer may sit a hair on the wrong side
        x += 1e-6
    return unity(workers, components, float(np.exp(x)), scale)


@lru_cache(maxsize=_CACHE)
def unity_best(workers: int, components: int, dtype: str = "float32", scale: str = "none") -> Design:
    """The unity design whose eps gives the least predicted error in ``dtype``: approximation
    error grows with eps, rounding error with cond(M), which falls with eps (up to a point).

    >>> 0 < unity_best(8, 16, "float32").eps < 0.5
    True
    """
    dtype = _check_dtype(dtype)
    if components <= workers:
        return unity(workers, components, scale=scale)
    with _one_blas_thread():
        x = _argmin_log(lambda x: np.log(_unity_error(workers, components, float(np.exp(x)), dtype, scale)),
                        np.log(_EPS_FLOOR), np.log(_EPS_TOP))
    return unity(workers, components, float(np.exp(x)), scale)


@lru_cache(maxsize=_CACHE)
def vandermonde_best(workers: int, components: int, dtype: str = "float32", scale: str = "none") -> Design:
    """The vandermonde design whose eps gives the least predicted error in ``dtype``.

    >>> vandermonde_best(4, 4, "float64").construction
    'vandermonde'
    """
    dtype = _check_dtype(dtype)
    _check(workers, components)
    rounds = components + workers - 2      # keep (1 + (c - 1) eps)^L within float64's range
    top = min(_EPS_TOP, (10 ** (150 / rounds) - 1) / max(components - 1, 1))
    def cost(x):
        return np.log(vandermonde(workers, components, float(np.exp(x)), scale).predicted_error(dtype))

    with _one_blas_thread():
        x = _argmin_log(cost, np.log(_EPS_FLOOR), np.log(top))
    return vandermonde(workers, components, float(np.exp(x)), scale)


def _check_max_cond(max_cond):
    if isinstance(max_cond, bool) or not isinstance(max_cond, (int, float)) or not 1 <= max_cond < 1e15:
        raise ConfigError(f"max_cond must be a number in [1, 1e15), got {max_cond!r}")


def default_max_cond(workers: int, components: int, dtype) -> float:
    """The condition number of the best unity design for the dtype (per-worker scale): a bound
    that balances rounding against approximation.

    >>> default_max_cond(8, 16, "float32") > 1
    True
    """
    return unity_best(workers, components, _check_dtype(dtype), "per_worker").cond


@lru_cache(maxsize=_CACHE)
def optimized(workers: int, components: int, max_cond: float, dtype: str = "float32") -> Design:
    """Points chosen by numerical optimization: the least predicted worst-worker error
    (rounding in ``dtype`` included) subject to cond(M) <= ``max_cond``.

    Layer 0 stays on the roots of unity (exact); each further layer l gets a free radius
    and rotation; every worker decodes with its own optimal scale. Starts from the unity
    design at the same bound (or the best unity design, if that meets it), so it is never worse
    than it. Cached: a training step never re-optimizes.

    >>> optimized(4, 4, 10.0).construction, optimized(4, 4, 10.0).cond < 10
    ('optimized', True)
    """
    _check(workers, components)
    _check_max_cond(max_cond)
    dtype = _check_dtype(dtype)
    start = unity_best(workers, components, dtype, "per_worker")        # the least error of all eps,
    if start.cond > max_cond:                                            # when it meets the bound
        start = unity_at_cond(workers, components, max_cond, scale="per_worker")
    if components <= workers:
        return Design(workers, components, start.points, "optimized", None, "per_worker",
                      {"max_cond": max_cond, "dtype": dtype})
    base = [_roots_upper(workers, min(workers, components - l * workers))
            for l in range(-(-components // workers))]

    def design(x):
        # radius and rotation per layer; real modes only scale, or they would carry two components
        layers = [base[0]] + [b * np.exp(x[2 * l - 2] + 1j * x[2 * l - 1] * (np.abs(b.imag) > 1e-12))
                              for l, b in enumerate(base) if l]
        return Design(workers, components, np.concatenate(layers), "optimized", None, "per_worker",
                      {"max_cond": max_cond, "dtype": dtype})

    def objective(x):
        d = design(x)
        if not np.isfinite(d.cond):
            return 1e3
        return np.log(d.predicted_error(dtype)) + max(0.0, np.log(d.cond / max_cond)) * 100

    x0 = np.zeros(2 * (len(base) - 1))
    x0[0::2] = np.log1p(start.eps) * np.arange(1, len(base))
    with _one_blas_thread():
        # a few percent of error is all that is left to win after ~40 steps per parameter
        best = scipy.optimize.minimize(objective, x0, method="Nelder-Mead",
                                       options={"xatol": 1e-4, "fatol": 1e-3, "maxfev": min(40 * len(x0), 240)})
        found = design(best.x)
        if found.cond > max_cond * 1.0001 or found.predicted_error(dtype) > start.predicted_error(dtype):
            found = design(x0)
    return found


@lru_cache(maxsize=_CACHE)
def best(workers: int, components: int, dtype: str = "float32") -> Design:
    """The design of least ``checked_error`` in ``dtype``: each construction at its best (unity
    and vandermonde at their best eps, optimized under the best unity design's cond(M)), every
    worker decoding with its own scale (which never does worse than a common one).

    >>> best(8, 8).construction, best(8, 16, "float32").checked_error("float32") < 2e-3
    ('unity', True)
    """
    _check(workers, components)
    dtype = _check_dtype(dtype)
    candidates = [make(workers, components, name, dtype=dtype, max_error=None) for name in ("unity", "vandermonde")]
    if default_max_cond(workers, components, dtype) < 1e15:          # else no bound optimized could keep
        candidates.append(make(workers, components, "optimized", dtype=dtype, max_error=None))
    chosen = None
    for design in sorted(candidates, key=lambda d: d.predicted_error(dtype)):    # ties: in the order above
        if chosen is not None and design.predicted_error(dtype) >= chosen.checked_error(dtype):
            break                  # a checked error is never below the prediction: nothing left can win
        if chosen is None or design.checked_error(dtype) < chosen.checked_error(dtype):
            chosen = design
    return chosen


@lru_cache(maxsize=_CACHE)
def largest_components(workers: int, dtype: str = "float32", max_error: float = DEFAULT_MAX_ERROR) -> int:
    """The largest c whose best design predicts at most ``max_error`` for N = ``workers`` (0 if
    none does). c <= N is exact up to rounding; beyond, each layer of N more components costs a
    factor eps in cond(M), so the error climbs layer by layer (and, less regularly, within one).
    Probes the first c of each layer, then bisects the layer where the error crosses the bound.

    >>> largest_components(4, "float32"), largest_components(8, "float32")
    (8, 16)
    """
    _check(workers, 1)
    dtype = _check_dtype(dtype)

    def ok(c):
        return best(workers, c, dtype).checked_error(dtype) <= max_error

    if not ok(1):
        return 0
    lo, hi = 1, workers
    if ok(workers):
        lo, hi = workers, None
        for layer in range(1, _MAX_LAYERS):
            if not ok(layer * workers + 1):
                hi = layer * workers + 1
                break
            lo = layer * workers + 1
        if hi is None:
            return lo
    while hi - lo > 1:                     # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def check_error(design: Design, dtype, max_error: float = DEFAULT_MAX_ERROR, chosen: bool = True) -> None:
    """Refuse ``design`` (ConfigError, one line) if it predicts more than ``max_error`` in ``dtype``.

    ``chosen``: the design is the default for its N and c (else the message also gives the
    default's error). The message names N, c, the predicted error and the largest c that meets
    the bound.

    >>> check_error(unity(4, 4), "float32")            # exact: nothing to refuse
    """
    dtype = _check_dtype(dtype)
    error = design.checked_error(dtype)
    if error <= max_error:
        return
    n, c = design.workers, design.components
    if not np.isfinite(error) or max_error >= 1:     # nothing to search for: no useful c meets it
        raise ConfigError(f"CERAR with N = {n} workers and c = {c} components predicts a relative error of "
                          f"{error:.3g} in {dtype}, above max_error = {max_error:g}")
    largest = largest_components(n, dtype, max_error)
    r = -(-c // n) - 1
    why = (f"CERAR with N = {n} workers and c = {c} components predicts a relative error of {error:.3g} "
           f"in {dtype}, above max_error = {max_error:g}")
    if not chosen and c <= largest:
        why += (f"; the default design for this c (no eps, max_cond, construction or scale) predicts "
                f"{best(n, c, dtype).checked_error(dtype):.2g}")
    if largest:
        why += f"; the largest c that meets it for N = {n} in {dtype} is {largest}"
    else:
        why += f"; no c meets it for N = {n} in {dtype}"
    if r > 0 and c > largest:
        why += (f" (cond(M) grows like eps^-r with r = ceil(c/N) - 1 = {r}, so c far above N cannot be "
                f"conditioned)")
    raise ConfigError(why)


def make(workers: int, components: int, construction: str | None = None, eps: float | None = None,
         max_cond: float | None = None, dtype="float32", scale: str | None = None,
         max_error: float | None = DEFAULT_MAX_ERROR) -> Design:
    """A design by construction name (default: the best for N, c and the dtype), from ``eps``
    or a condition bound (default: the best for the dtype), refused (ConfigError) if its
    predicted error in ``dtype`` is above ``max_error`` (None: not checked).

    >>> make(8, 16, eps=1e-3).cond < 1e4
    True
    >>> make(2, 16)
    Traceback (most recent call last):
    ...
    gradsync.errors.ConfigError: CERAR with N = 2 workers and c = 16 components predicts a relative error of ...
    """
    if construction is not None and construction not in CONSTRUCTIONS:
        raise ConfigError(f"unknown construction {construction!r}: expected one of {', '.join(CONSTRUCTIONS)}")
    _check(workers, components)
    dtype = _check_dtype(dtype)
    if eps is not None and max_cond is not None:
        raise ConfigError("give eps or max_cond, not both")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1):
        raise ConfigError(f"eps must be a number in (0, 1), got {eps!r}")
    if scale is not None and scale not in SCALES:
        raise ConfigError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if max_error is not None and (isinstance(max_error, bool) or not isinstance(max_error, (int, float))
                                  or not max_error > 0):
        raise ConfigError(f"max_error must be a positive number, got {max_error!r}")
    chosen = construction is None and eps is None and max_cond is None and scale is None
    if chosen:
        design = best(workers, components, dtype)
    else:
        design = _build(workers, components, construction or "unity", eps, max_cond, dtype, scale or "per_worker",
                        max_error)
    if max_error is not None:
        check_error(design, dtype, max_error, chosen)
    return design


def _build(workers, components, construction, eps, max_cond, dtype, scale, max_error) -> Design:
    if construction == "optimized":
        if eps is not None:
            raise ConfigError("the optimized construction takes max_cond, not eps")
        if max_cond is None:
            max_cond = default_max_cond(workers, components, dtype)
            if max_cond >= 1e15 and max_error is not None:    # no bound to keep: say why, not max_cond
                check_error(unity_best(workers, components, dtype, "per_worker"), dtype, max_error)
        return optimized(workers, components, float(max_cond), dtype)
    if construction == "vandermonde":
        if max_cond is not None:
            raise ConfigError("the vandermonde construction takes eps, not max_cond")
        if eps is None:
            return vandermonde_best(workers, components, dtype, scale)
        return vandermonde(workers, components, eps, scale)
    if eps is None and components > workers:
        if max_cond is None:
            return unity_best(workers, components, dtype, scale)
        return unity_at_cond(workers, components, float(max_cond), scale)
    return unity(workers, components, eps, scale)

