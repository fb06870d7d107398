"""CERAR designs and codec: coded approximate ring all-reduce (Munim and Ramamoorthy).

Vocabulary (see ``shared/design/cerar.md``): each worker's gradient of d elements is split
into c **components** of m = ceil(d / c) elements. A **mode** is a point x_p of the complex
plane carrying one component (real x) or two (complex x: real and imaginary part). Worker i
encodes round tau as E_i(tau) = Re(sum_p x_p^(tau - i) h_i^(p)). In round t = 1..L
(L = c + N - 2) worker j sends P_j(t) = P_{j-1}(t-1) - E_j(t - N) + E_j(t) to j + 1, a window
of the last N workers' encodings. For t >= N - 1 what j receives, less its own term, is
Q_j(t) = Re(sum_p x_p^t u_p) with u_p = x_p^(1-j) (A_p + x_p^(-N) B_p), A_p and B_p the sums
of the workers before and after j. Solving the c x c real system M for u and adding h_j gives
A_p + x_p^(-N) B_p + h_j: exact where x_p^N = 1, off by (x_p^(-N) - 1) B_p elsewhere.

Precision: coefficients (powers of x, M and its factorization) are computed in float64, since
powers up to x^L lose digits in float32. The products with gradient data run in the payload
dtype: packets are rounded to it on the wire anyway, so a wider product would not change the
error's order. The decode error is about (approximation) + cond(M) * sqrt(L) * unit roundoff.

Choosing: ``best`` searches every construction for the design of least error in a dtype;
``make`` refuses (ConfigError) a design whose ``checked_error`` (that prediction, or a
measurement if worse) exceeds ``max_error``, naming ``largest_components``.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import scipy.linalg
import scipy.optimize

from ..errors import ConfigError

CONSTRUCTIONS = ("unity", "vandermonde", "optimized")
SCALES = ("none", "midpoint", "per_worker")
# float16: fp16 packets (``compression="fp16"`` over CERAR); its 11-bit rounding, amplified by
# cond(M), leaves c > N designs at 2% error at best, so the default max_error refuses them
UNIT_ROUNDOFF = {"float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}


def _check(workers, components):
    for name, v in (("workers", workers), ("components", components)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if workers < 2:
        raise ConfigError("CERAR needs at least 2 workers (one worker has nothing to reduce)")


def _check_dtype(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in UNIT_ROUNDOFF:
        raise ConfigError(f"CERAR payloads must be float16, float32 or float64, got {name}")
    return name


@dataclass(frozen=True, eq=False)
class Design:
    """The points (modes) of a CERAR code and how workers scale their decoded sums.

    >>> d = unity(8, 8)
    >>> d.rounds, round(d.comm_rate, 3), round(d.cond, 1)
    (14, 1.75, 1.4)
    """

    workers: int
    components: int
    points: np.ndarray                   # complex, one per mode (imag >= 0)
    construction: str = "unity"
    eps: float | None = None
    scale: str = "none"                  # decode scale: see ``decode_scale``
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        widths = self.widths
        if widths.sum() != self.components:
            raise AssertionError(f"modes carry {widths.sum()} components, not {self.components}")
        if self.scale not in SCALES:
            raise ConfigError(f"scale must be one of {', '.join(SCALES)}, got {self.scale!r}")

    # --- shape of the protocol --------------------------------------------------------------
    @property
    def rounds(self) -> int:
        """L = c + N - 2 communication rounds."""
        return self.components + self.workers - 2

    @property
    def comm_rate(self) -> float:
        """Elements sent per worker over d: (c + N - 2) / c."""
        return self.rounds / self.components

    @property
    def ring_rate(self) -> float:
        return 2 * (self.workers - 1) / self.workers

    @property
    def storage_rate(self) -> float:
        """Numbers stored per worker over d: (c + N) / c (own components plus N packets)."""
        return 1 + self.workers / self.components

    @cached_property
    def widths(self) -> np.ndarray:
        return np.where(np.abs(self.points.imag) > 1e-15 * np.abs(self.points), 2, 1)

    @cached_property
    def _columns(self):
        """(mode index, is imaginary part) for each of the c real columns."""
        mode = np.repeat(np.arange(len(self.points)), self.widths)
        imag = np.concatenate([[0] if w == 1 else [0, 1] for w in self.widths]).astype(bool)
        return mode, imag

    def coefficients(self, exponents) -> np.ndarray:
        """Rows Re/-Im of x^e for each exponent e: the map from components to an encoding."""
        mode, imag = self._columns
        e, x = np.asarray(exponents, dtype=float)[:, None], self.points[mode]
        angle = e * np.angle(x)          # x^e in polar form: 5x faster than complex powers
        return np.exp(e * np.log(np.abs(x))) * np.where(imag, -np.sin(angle), np.cos(angle))

    @cached_property
    def matrix(self) -> np.ndarray:
        """M (c x c): received rounds t = N-1..L against the unknowns (Re u_p, Im u_p)."""
        return self.coefficients(np.arange(self.workers - 1, self.rounds + 1))

    @cached_property
    def cond(self) -> float:
        """cond(M), 2-norm; inf where M does not fit in float64 (points far from the unit circle)."""
        m = self.matrix            # (no _one_blas_thread in a cached_property: its lock is class-wide)
        return float(np.linalg.cond(m)) if np.isfinite(m).all() else float("inf")

    @cached_property
    def inverse(self) -> np.ndarray:
        """M^-1 (float64), computed once for every worker's decoder."""
        x = scipy.linalg.lu_solve(scipy.linalg.lu_factor(self.matrix), np.eye(self.components))
        x.flags.writeable = False
        return x

    def encoder(self, worker: int) -> np.ndarray:
        """A_i (L x c): row tau - 1 encodes round tau, E_i(tau) = A_i[tau - 1] @ G_i."""
        if 0 <= worker < self.workers:        # a slice of the exponents every worker uses
            start = self.workers - 1 - worker
            return self._powers[start:start + self.rounds]
        return self.coefficients(np.arange(1, self.rounds + 1) - worker)

    @cached_property
    def _powers(self) -> np.ndarray:
        """coefficients of the exponents 2 - N .. L, those of every worker's encoder."""
        out = self.coefficients(np.arange(2 - self.workers, self.rounds + 1))
        out.flags.writeable = False
        return out

    @lru_cache(maxsize=None)
    def sender(self, worker: int) -> np.ndarray:
        """F_j (L x c): what worker j adds to the packet it forwards in round t, E_j(t) - E_j(t - N).

        Folding the subtraction into the matrix leaves one add per round on the data.
        """
        a = self.encoder(worker)
        f = a.copy()
        f[self.workers:] -= a[:-self.workers]
        f.flags.writeable = False
        return f

    def decode_scale(self, worker: int) -> np.ndarray:
        """Complex scale s_p by which worker j multiplies its decoded A_p + q_p B_p (q = x^-N).

        none: 1. midpoint: 2 / (1 + q), which halves the worst error. per_worker: the scale
        minimising the expected error for i.i.d. gradients, given that j's A holds j workers
        and B holds N - 1 - j: s = (j + (N-1-j) conj(q)) / (j + (N-1-j) |q|^2). It makes
        workers 0 and N - 1 exact, and so every worker when N = 2.
        """
        return self._scales(np.array([worker]))[0]

    def _scales(self, workers: np.ndarray) -> np.ndarray:
        """``decode_scale`` of each worker in ``workers``, one row each."""
        q = self.points ** (-float(self.workers))
        if self.scale == "none":
            return np.ones((len(workers), len(q)), complex)
        if self.scale == "midpoint":
            return np.broadcast_to(2 / (1 + q), (len(workers), len(q)))
        a, b = workers[:, None], self.workers - 1 - workers[:, None]
        return (a + b * np.conj(q)) / (a + b * np.abs(q) ** 2)

    @lru_cache(maxsize=None)
    def decoder(self, worker: int) -> np.ndarray:
        """[R_j | B_j] (c x 2c), cached: see ``_decoder``."""
        out = self._decoder(worker)
        out.flags.writeable = False
        return out

    def _decoder(self, worker: int) -> np.ndarray:
        """[R_j | B_j] (c x 2c): estimate = R_j @ raw_j + B_j @ G_j.

        raw_j are the c packets received in rounds t = N-1..L. Solving M for u from the windows
        Q_j(t) = raw_j(t) - E_j(t - N + 1) and adding h_j is linear in raw_j and G_j, so it is
        one matrix: R_j = D_j M^-1 (D_j multiplies by s_p x_p^(j-1)) and B_j = I - R_j W_j, with
        W_j the rows of A_j for rounds 0..c-1 (round 0 encodes nothing). W_j is W_0 with each
        mode multiplied by x_p^-j, so R_j W_j = D_j (M^-1 W_0) X_j: O(c^2) per worker.
        """
        w = self.decode_scale(worker) * self.points ** (worker - 1.0)
        r = self._times(w, self.inverse, left=True)
        rw = self._times(self.points ** (-float(worker)), self._times(w, self._inverse_own, left=True), left=False)
        return np.hstack([r, np.eye(self.components) - rw])

    @cached_property
    def _inverse_own(self) -> np.ndarray:
        own = np.zeros((self.components, self.components))
        own[1:] = self.encoder(0)[:self.components - 1]
        return self.inverse @ own

    def _times(self, w: np.ndarray, a: np.ndarray, left: bool) -> np.ndarray:
        """Multiply by the complex w_p of each mode, on the real (Re, -Im) pairs of ``a``: its
        rows (``left``: D @ a) or its columns (a @ D), D block-diagonal as in ``decoder``."""
        mode, imag = self._columns
        w = w[mode]
        pair = np.flatnonzero(imag)
        if left:
            out = w.real[:, None] * a
            out[pair - 1] -= w.imag[pair, None] * a[pair]
            out[pair] += w.imag[pair - 1, None] * a[pair - 1]
        else:
            out = a * w.real[None, :]
            out[:, pair - 1] += a[:, pair] * w.imag[pair]
            out[:, pair] -= a[:, pair - 1] * w.imag[pair - 1]
        return out

    # --- error ---------------------------------------------------------------------------------
    def predicted_error(self, dtype="float64") -> float:
        """Expected relative L2 error of the worst worker for i.i.d. gradients, rounding included."""
        n = self.workers
        j = np.arange(n)
        q = self.points ** (-float(n))
        s = self._scales(j)
        err = (j[:, None] * np.abs(s - 1) ** 2 + (n - 1 - j)[:, None] * np.abs(s * q - 1) ** 2) @ self.widths
        worst = float(err.max()) / (n * self.components)
        rounding = self.cond * np.sqrt(self.rounds) * UNIT_ROUNDOFF[_check_dtype(dtype)]
        return float(np.hypot(np.sqrt(worst), rounding))

    def checked_error(self, dtype="float32") -> float:
        """The relative error this design is held to in ``dtype``: the larger of
        ``predicted_error`` and the worst worker's error measured on random Gaussian gradients
        (32 elements per component, a fixed seed). The prediction's rounding term,
        cond(M) sqrt(L) u, tracks unity designs, but not every point set an optimizer finds
        (N = 2, c = 24, float64: predicted 0.006, measured 0.5), so it is never used alone.
        Cached per design."""
        dtype = _check_dtype(dtype)
        cache = self.__dict__.setdefault("_checked", {})
        if dtype not in cache:
            inputs = np.random.default_rng(0).standard_normal((self.workers, 32 * self.components)).astype(dtype)
            exact = inputs.astype(np.float64).sum(axis=0)
            with _one_blas_thread(), np.errstate(all="ignore"):
                estimates = _run_batched(self, inputs).astype(np.float64)
            measured = float((np.linalg.norm(estimates - exact, axis=1) / np.linalg.norm(exact)).max())
            cache[dtype] = max(self.predicted_error(dtype), measured if np.isfinite(measured) else float("inf"))
        return cache[dtype]

    def to_dict(self) -> dict:
        return {"name": "cerar", "workers": self.workers, "components": self.components,
                "points": [[float(p.real), float(p.imag)] for p in self.points],
                "construction": self.construction, "eps": self.eps, "scale": self.scale,
                "params": self.params}

    @classmethod
    def from_dict(cls, data: dict) -> "Design":
        points = np.array([complex(re, im) for re, im in data["points"]])
        return cls(int(data["workers"]), int(data["components"]), points, data.get("construction", "unity"),
                   data.get("eps"), data.get("scale", "none"), dict(data.get("params") or {}))


# --- constructions -----------------------------------------------------------------------------

def _roots_upper(workers: int, count: int) -> np.ndarray:
    """Roots of unity of the closed upper half plane carrying exactly ``count`` <= N components.

    When fewer than all are needed, the complex ones are taken evenly spread in angle: any N-th
    root is exact, and clustered points make M ill-conditioned (N = 16, c = 5: cond 422 for
    the first roots, 3.2 spread; c = 8: 237 against 1.0).
    """
    roots = np.exp(2j * np.pi * np.arange(workers // 2 + 1) / workers)
    real = [r.real for r in roots if abs(r.imag) < 1e-12]            # 1, and -1 for even N
    cplx = [r for r in roots if abs(r.imag) >= 1e-12]
    n_cplx = min(len(cplx), count // 2)
    n_real = count - 2 * n_cplx
    assert n_real <= len(real), (workers, count)
    picked = np.floor((np.arange(n_cplx) + 0.5) * len(cplx) / max(n_cplx, 1)).astype(int)
    return np.array(real[:n_real] + [cplx[i] for i in picked], dtype=complex)


def unity(workers: int, components: int, eps: float | None = None, scale: str = "none") -> Design:
    """Roots of unity; for c > N further layers l = 1..r scaled radially by (1 + eps)^l.

    Exact for c <= N. Error O(N eps) and cond(M) O(eps^-r), r = ceil(c/N) - 1.

    >>> unity(4, 4).predicted_error() < 1e-14
    True
    """
    _check(workers, components)
    layers = -(-components // workers)
    if layers > 1 and (eps is None or not 0 < eps < 1):
        raise ConfigError(f"eps must be in (0, 1) for c = {components} > N = {workers}, got {eps!r}")
    points = [_roots_upper(workers, min(workers, components - l * workers)) * (1 + (eps or 0)) ** l
              for l in range(layers)]
    return Design(workers, components, np.concatenate(points), "unity", eps if layers > 1 else None, scale)


def vandermonde(workers: int, components: int, eps: float = 1e-2, scale: str = "none") -> Design:
    """The ill-conditioned baseline: real points 1, 1 + eps, ..., 1 + (c - 1) eps.

    >>> vandermonde(4, 1).predicted_error() < 1e-14
    True
    """
    _check(workers, components)
    if not 0 < eps < 1:
        raise ConfigError(f"eps must be in (0, 1), got {eps!r}")
    return Design(workers, components, 1 + eps * np.arange(components, dtype=complex), "vandermonde", eps, scale)


# --- choosing a design: the least predicted error, or a refusal above a tolerance ---------------

_EPS_FLOOR, _EPS_TOP = 1e-12, 0.5
_GRID = 13               # log-spaced eps tried before refining: about one per factor 9
_CACHE = 512             # designs (and searches) kept per process, by value
_MAX_LAYERS = 16         # largest_components looks no further than c = 16 N
DEFAULT_MAX_ERROR = 1e-2


_BLAS_LOCK = threading.RLock()


@contextlib.contextmanager
def _one_blas_thread():
    """cond(M) of a few hundred columns runs best on one BLAS thread, and far better when the
    cores are busy (a 128 x 128 SVD took 0.9 s on two contended threads, 2 ms on one). The
    limit is process-wide: one thread at a time sets it, so each restores what it found."""
    controller = _blas_controller()
    with _BLAS_LOCK, (controller.limit(limits=1, user_api="blas") if controller is not None
                      else contextlib.nullcontext()):
        yield


@lru_cache(maxsize=1)
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController
        return ThreadpoolController()
    except Exception:          # threadpoolctl comes with scikit-learn; without it, BLAS's default
        return None


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
    """The unity design with the smallest eps whose cond(M) stays within ``max_cond``."""
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
    error grows with eps, rounding error with cond(M), which falls with eps (up to a point)."""
    dtype = _check_dtype(dtype)
    if components <= workers:
        return unity(workers, components, scale=scale)
    with _one_blas_thread():
        x = _argmin_log(lambda x: np.log(_unity_error(workers, components, float(np.exp(x)), dtype, scale)),
                        np.log(_EPS_FLOOR), np.log(_EPS_TOP))
    return unity(workers, components, float(np.exp(x)), scale)


@lru_cache(maxsize=_CACHE)
def vandermonde_best(workers: int, components: int, dtype: str = "float32", scale: str = "none") -> Design:
    """The vandermonde design whose eps gives the least predicted error in ``dtype``."""
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
    that balances rounding against approximation."""
    return unity_best(workers, components, _check_dtype(dtype), "per_worker").cond


@lru_cache(maxsize=_CACHE)
def optimized(workers: int, components: int, max_cond: float, dtype: str = "float32") -> Design:
    """Points chosen by numerical optimization: the least predicted worst-worker error
    (rounding in ``dtype`` included) subject to cond(M) <= ``max_cond``.

    Layer 0 stays on the roots of unity (exact); each further layer l gets a free radius
    and rotation; every worker decodes with its own optimal scale. Starts from the unity
    design at the same bound (or the best unity design, if that meets it), so it is never worse
    than it. Cached: a training step never re-optimizes.
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


# --- the codec: encode, run the ring, decode -------------------------------------------------

def split(flat: np.ndarray, components: int) -> np.ndarray:
    """Zero-pad a worker's d elements to c x m components."""
    m = -(-flat.shape[-1] // components)
    out = np.zeros(flat.shape[:-1] + (components * m,), flat.dtype)
    out[..., :flat.shape[-1]] = flat
    return out.reshape(flat.shape[:-1] + (components, m))


def measure(design: Design, elements: int = 1 << 14, dtype="float64", seed: int = 0) -> dict:
    """Error of a design on random Gaussian gradients: worst worker's relative L2 error, and the
    largest relative difference between two workers' estimates."""
    inputs = np.random.default_rng(seed).standard_normal((design.workers, elements)).astype(dtype)
    exact = inputs.astype(np.float64).sum(axis=0)
    est = emulate(design, inputs).astype(np.float64)
    norm = np.linalg.norm(exact)
    errors = np.linalg.norm(est - exact, axis=1) / norm
    spread = max(np.linalg.norm(est[a] - est[b]) for a in range(len(est)) for b in range(a)) / norm
    return {"rel_error": float(errors.max()), "worst_worker": int(errors.argmax()),
            "worker_spread": float(spread), "per_worker": errors.tolist()}


class Worker:
    """One worker's side of CERAR, on numpy arrays or torch tensors alike.

    ``packet(t)`` is what it sends in round t (1..L); ``receive(t)`` gives the buffer to receive
    round t's packet into; ``result()`` decodes. Per round the data sees one add.

    >>> import numpy as np
    >>> w = Worker(unity(2, 2), 0, np.arange(4.0))
    >>> w.packet(1).shape
    (2,)
    """

    def __init__(self, design: Design, worker: int, flat):
        self.design, self.worker, self.n = design, worker, design.workers
        self.d, c = flat.shape[0], design.components
        self.m = -(-self.d // c)
        if self.d == c * self.m:        # own G is a view of the input: nothing to copy up front
            self.own = flat.reshape(c, self.m)
        else:
            self.own = _zeros_like(flat, (c, self.m))
            self.own.reshape(-1)[:self.d] = flat
        self.window = _empty_like(flat, (c, self.m))         # the c packets kept, each written once
        # F_j(t) is made per round, not all L at once: the runtime then encodes while the
        # previous round's packets are on the wire, and never holds L x m encoded values
        self._sender = _matrix_like(flat, design.sender(worker))     # L x c
        self._scratch = _zeros_like(flat, (2, self.m))
        self._last = self._scratch[0]                          # P_{j-1}(t-1); zero before round 1

    def packet(self, t: int, start: int = 0, stop: int | None = None):
        """The packet sent in round t: what arrived in round t - 1 plus F_j(t); or its
        elements ``start:stop`` (a piece that can go as soon as that piece arrived)."""
        stop = self.m if stop is None else stop
        return self._last[start:stop] + self._sender[t - 1] @ self.own[:, start:stop]

    def receive(self, t: int):
        """Where round t's packet is received: kept for decoding once t >= N - 1."""
        if t >= self.n - 1:
            return self.window[t - (self.n - 1)]
        return self._scratch[t % 2]

    def received(self, t: int) -> None:
        self._last = self.receive(t)

    def result(self):
        """This worker's estimate of the sum, d elements."""
        c = self.design.components
        dec = _matrix_like(self.own, self.design.decoder(self.worker))     # c x 2c: window, then own
        return (dec[:, :c] @ self.window + dec[:, c:] @ self.own).reshape(-1)[:self.d]


def _empty_like(like, shape):
    if isinstance(like, np.ndarray):
        return np.empty(shape, like.dtype)
    return like.new_empty(shape)


def _zeros_like(like, shape):
    if isinstance(like, np.ndarray):
        return np.zeros(shape, like.dtype)
    return like.new_zeros(shape)


def _matrix_like(like, matrix: np.ndarray):
    """A float64 design matrix in the payload's dtype (and device, for torch)."""
    if isinstance(like, np.ndarray):
        return matrix.astype(like.dtype)
    import torch
    return torch.tensor(matrix, dtype=like.dtype, device=like.device)


@dataclass(frozen=True)
class Run:
    """What one emulated CERAR all-reduce produced."""

    estimates: np.ndarray        # N x d
    sent_elements: np.ndarray    # per worker, counted packet by packet


def run(design: Design, inputs: np.ndarray) -> Run:
    """Run CERAR's workers in lock-step on ``inputs`` (N x d), counting what each sends.

    The same ``Worker`` objects run in the runtime, one per process.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((4, 10))
    >>> bool(np.allclose(run(unity(4, 4), x).estimates, x.sum(axis=0)))
    True
    """
    n, d = inputs.shape
    if n != design.workers:
        raise ConfigError(f"design is for {design.workers} workers, inputs have {n}")
    _check_dtype(inputs.dtype)
    sent_elements = np.zeros(n, np.int64)
    if d == 0:
        return Run(inputs.copy(), sent_elements)
    workers = [Worker(design, j, inputs[j]) for j in range(n)]
    for t in range(1, design.rounds + 1):
        packets = [w.packet(t) for w in workers]
        for j, w in enumerate(workers):
            w.receive(t)[...] = packets[j - 1]                 # j receives from j - 1
            w.received(t)
            sent_elements[j] += packets[j].shape[0]
    return Run(np.stack([w.result() for w in workers]), sent_elements)


def _run_batched(design: Design, inputs: np.ndarray, chunk: int = 16) -> np.ndarray:
    """``emulate``'s estimates with all N workers in each numpy call, for ``checked_error``:
    the same products in the same dtype as ``Worker`` (bit for bit), 30x faster at N = 64.
    Memory stays O(N c m + chunk c^2): each round's sender rows come from the shared table of
    powers, and the decoders ``chunk`` workers at a time, none of them cached."""
    n, c = design.workers, design.components
    powers, workers = design._powers, np.arange(n)
    own = split(inputs, c)                                                        # N x c x m
    last = np.zeros((n, own.shape[-1]), inputs.dtype)
    window = np.empty((n, c, own.shape[-1]), inputs.dtype)
    for t in range(1, design.rounds + 1):
        rows = powers[n - 2 + t - workers] - (powers[t - 2 - workers] if t > n else 0)   # sender(j)[t - 1]
        last = np.roll(last + (rows.astype(inputs.dtype)[:, None, :] @ own)[:, 0], 1, axis=0)   # j gets j - 1's
        if t >= n - 1:
            window[:, t - (n - 1)] = last
    out = np.empty_like(own)
    for lo in range(0, n, chunk):
        decoders = np.stack([design._decoder(j) for j in range(lo, min(lo + chunk, n))]).astype(inputs.dtype)
        out[lo:lo + chunk] = decoders[:, :, :c] @ window[lo:lo + chunk] + decoders[:, :, c:] @ own[lo:lo + chunk]
    return out.reshape(n, -1)[:, :inputs.shape[-1]]


def emulate(design: Design, inputs: np.ndarray) -> np.ndarray:
    """Each worker's estimate of the sum of ``inputs`` (N x d)."""
    return run(design, inputs).estimates


def emulate_schedule(schedule, inputs: np.ndarray) -> np.ndarray:
    return emulate(Design.from_dict(schedule.codec), inputs)


def verify_schedule(schedule) -> None:
    """A CERAR schedule: L rounds in which every worker sends one packet of m to its successor."""
    design = Design.from_dict(schedule.codec)
    n, t = schedule.workers, schedule.transfers
    if design.workers != n:
        raise ConfigError(f"codec is for {design.workers} workers, schedule has {n}")
    m = -(-schedule.elements // design.components)
    if m == 0:
        return
    expect_src = np.tile(np.arange(n), design.rounds)
    ok = (len(t) == n * design.rounds and np.array_equal(np.sort(t["round"]), np.repeat(np.arange(1, design.rounds + 1), n))
          and np.all(t["count"] == m) and np.array_equal(np.sort(t["src"]), np.sort(expect_src))
          and np.all(t["dst"] == (t["src"] + 1) % n) and np.all(t["op"] == 2))
    if not ok:
        raise ConfigError(f"not a CERAR schedule: expected {design.rounds} rounds of one packet of {m} "
                          f"elements from every worker to its successor")
    if not np.isfinite(design.cond) or design.cond > 1e15:
        raise ConfigError(f"decoding matrix is singular (cond {design.cond:.3g})")
