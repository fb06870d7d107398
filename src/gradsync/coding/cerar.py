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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import scipy.linalg
import scipy.optimize

from ..errors import ConfigError

CONSTRUCTIONS = ("unity", "vandermonde", "optimized")
SCALES = ("none", "midpoint", "per_worker")
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53}


def _check(workers, components):
    for name, v in (("workers", workers), ("components", components)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if workers < 2:
        raise ConfigError("CERAR needs at least 2 workers (one worker has nothing to reduce)")


def _check_dtype(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in UNIT_ROUNDOFF:
        raise ConfigError(f"CERAR payloads must be float32 or float64, got {name}")
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
        powers = self.points[None, :] ** np.asarray(exponents, dtype=float)[:, None]
        cols = powers[:, mode]
        return np.where(imag[None, :], -cols.imag, cols.real)

    @cached_property
    def matrix(self) -> np.ndarray:
        """M (c x c): received rounds t = N-1..L against the unknowns (Re u_p, Im u_p)."""
        return self.coefficients(np.arange(self.workers - 1, self.rounds + 1))

    @cached_property
    def cond(self) -> float:
        return float(np.linalg.cond(self.matrix))

    @cached_property
    def _lu(self):
        return scipy.linalg.lu_factor(self.matrix)

    def encoder(self, worker: int) -> np.ndarray:
        """A_i (L x c): row tau - 1 encodes round tau, E_i(tau) = A_i[tau - 1] @ G_i."""
        return self.coefficients(np.arange(1, self.rounds + 1) - worker)

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
        workers 0 and N - 1 exact.
        """
        q = self.points ** (-float(self.workers))
        if self.scale == "none":
            return np.ones_like(q)
        if self.scale == "midpoint":
            return 2 / (1 + q)
        a, b = worker, self.workers - 1 - worker
        return (a + b * np.conj(q)) / (a + b * np.abs(q) ** 2)

    @lru_cache(maxsize=None)
    def decoder(self, worker: int) -> np.ndarray:
        """[R_j | B_j] (c x 2c): estimate = R_j @ raw_j + B_j @ G_j.

        raw_j are the c packets received in rounds t = N-1..L. Solving M for u from the windows
        Q_j(t) = raw_j(t) - E_j(t - N + 1) and adding h_j is linear in raw_j and G_j, so it is
        one matrix: R_j = D_j M^-1 (D_j multiplies by s_p x_p^(j-1)) and B_j = I - R_j W_j, with
        W_j the rows of A_j for rounds 0..c-1 (round 0 encodes nothing).
        """
        mode, imag = self._columns
        w = (self.decode_scale(worker) * self.points ** (worker - 1.0))[mode]
        # complex multiply (v_re + i v_im) * w, written as a block-diagonal real matrix
        d = np.diag(w.real)
        pair = np.flatnonzero(imag)
        d[pair - 1, pair] = -w.imag[pair]
        d[pair, pair - 1] = w.imag[pair - 1]
        r = d @ scipy.linalg.lu_solve(self._lu, np.eye(self.components))
        own = np.zeros((self.components, self.components))
        own[1:] = self.encoder(worker)[:self.components - 1]
        out = np.hstack([r, np.eye(self.components) - r @ own])
        out.flags.writeable = False
        return out

    # --- error ---------------------------------------------------------------------------------
    def predicted_error(self, dtype="float64") -> float:
        """Expected relative L2 error of the worst worker for i.i.d. gradients, rounding included."""
        q = self.points ** (-float(self.workers))
        n, worst = self.workers, 0.0
        for j in range(n):
            s = self.decode_scale(j)
            err = (j * np.abs(s - 1) ** 2 + (n - 1 - j) * np.abs(s * q - 1) ** 2) * self.widths
            worst = max(worst, float(err.sum()) / (n * self.components))
        rounding = self.cond * np.sqrt(self.rounds) * UNIT_ROUNDOFF[_check_dtype(dtype)]
        return float(np.sqrt(worst + rounding**2))

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


_EPS_FLOOR = 1e-12


@lru_cache(maxsize=256)
def _eps_of_least_cond(workers: int, components: int) -> float:
    """cond(M) of the unity design is U-shaped in eps: it falls as the layers separate, then
    rises as (1 + eps)^L unbalances the columns. Small eps (good accuracy) lie left of here."""
    res = scipy.optimize.minimize_scalar(lambda x: np.log(unity(workers, components, float(np.exp(x))).cond),
                                         bounds=(np.log(_EPS_FLOOR), np.log(0.5)), method="bounded")
    return float(np.exp(res.x))


def unity_at_cond(workers: int, components: int, max_cond: float, scale: str = "none") -> Design:
    """The unity design with the smallest eps whose cond(M) stays within ``max_cond``."""
    _check_max_cond(max_cond)
    if components <= workers:
        return unity(workers, components, scale=scale)
    top = _eps_of_least_cond(workers, components)
    if unity(workers, components, top).cond > max_cond:
        raise ConfigError(f"no unity design for N = {workers}, c = {components} has cond(M) <= {max_cond:g} "
                          f"(the least is {unity(workers, components, top).cond:.3g}); raise max_cond "
                          f"or lower the components")
    lo, hi = np.log(_EPS_FLOOR), np.log(top)
    for _ in range(60):
        mid = (lo + hi) / 2
        if unity(workers, components, float(np.exp(mid))).cond > max_cond:
            lo = mid
        else:
            hi = mid
    return unity(workers, components, float(np.exp(hi)), scale)


def _best_eps(build, top: float, dtype: str) -> Design:
    """The design ``build(eps)`` with the least predicted error in ``dtype``, eps up to ``top``:
    approximation error grows with eps, rounding error with cond(M), which falls with eps."""
    def cost(x):
        return np.log(build(float(np.exp(x))).predicted_error(dtype))

    grid = np.linspace(np.log(_EPS_FLOOR), np.log(top), 41)   # the objective can be jagged
    i = int(np.argmin([cost(x) for x in grid]))
    res = scipy.optimize.minimize_scalar(cost, bounds=(grid[max(i - 1, 0)], grid[min(i + 1, 40)]),
                                         method="bounded")
    return build(float(np.exp(res.x if res.fun <= cost(grid[i]) else grid[i])))


@lru_cache(maxsize=256)
def unity_best(workers: int, components: int, dtype: str = "float32", scale: str = "none") -> Design:
    """The unity design whose eps gives the least predicted error in ``dtype``."""
    dtype = _check_dtype(dtype)
    if components <= workers:
        return unity(workers, components, scale=scale)
    return _best_eps(lambda e: unity(workers, components, e, scale), _eps_of_least_cond(workers, components), dtype)


@lru_cache(maxsize=256)
def vandermonde_best(workers: int, components: int, dtype: str = "float32", scale: str = "none") -> Design:
    """The vandermonde design whose eps gives the least predicted error in ``dtype``."""
    return _best_eps(lambda e: vandermonde(workers, components, e, scale), 0.5, _check_dtype(dtype))


def _check_max_cond(max_cond):
    if isinstance(max_cond, bool) or not isinstance(max_cond, (int, float)) or not 1 <= max_cond < 1e15:
        raise ConfigError(f"max_cond must be a number in [1, 1e15), got {max_cond!r}")


def default_max_cond(workers: int, components: int, dtype) -> float:
    """The condition number of the best unity design for the dtype: a bound that balances
    rounding against approximation."""
    return unity_best(workers, components, _check_dtype(dtype)).cond


@lru_cache(maxsize=256)
def optimized(workers: int, components: int, max_cond: float, dtype: str = "float32") -> Design:
    """Points chosen by numerical optimization: the least predicted worst-worker error
    (rounding in ``dtype`` included) subject to cond(M) <= ``max_cond``.

    Layer 0 stays on the roots of unity (exact); each further layer l gets a free radius
    and rotation; every worker decodes with its own optimal scale. Starts from the unity
    design at the same bound, so it is never worse than it. Cached: a training step never
    re-optimizes.
    """
    _check(workers, components)
    _check_max_cond(max_cond)
    dtype = _check_dtype(dtype)
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
        return d.predicted_error(dtype) * (1 + max(0.0, np.log(d.cond / max_cond)) * 100)

    eps = start.eps
    x0 = np.zeros(2 * (len(base) - 1))
    x0[0::2] = np.log1p(eps) * np.arange(1, len(base))
    best = scipy.optimize.minimize(objective, x0, method="Nelder-Mead",
                                   options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 400 * len(x0)})
    found = design(best.x)
    if found.cond > max_cond * 1.0001 or found.predicted_error(dtype) > start.predicted_error(dtype):
        found = design(x0)
    return found


def make(workers: int, components: int, construction: str = "unity", eps: float | None = None,
         max_cond: float | None = None, dtype="float32", scale: str | None = None) -> Design:
    """A design by construction name, from ``eps`` or a condition bound (default: per dtype).

    >>> make(8, 16, eps=1e-3).cond < 1e4
    True
    """
    if construction not in CONSTRUCTIONS:
        raise ConfigError(f"unknown construction {construction!r}: expected one of {', '.join(CONSTRUCTIONS)}")
    _check(workers, components)
    dtype = _check_dtype(dtype)
    if eps is not None and max_cond is not None:
        raise ConfigError("give eps or max_cond, not both")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1):
        raise ConfigError(f"eps must be a number in (0, 1), got {eps!r}")
    if construction == "optimized":
        if eps is not None:
            raise ConfigError("the optimized construction takes max_cond, not eps")
        return optimized(workers, components, float(max_cond or default_max_cond(workers, components, dtype)), dtype)
    scale = scale or "none"
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
