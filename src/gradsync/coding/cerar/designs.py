"""CERAR designs: the points of a code, the matrices they give, and the plain constructions.

A ``Design`` holds the modes x_p (vocabulary in the package docstring) and derives from them
all a worker needs: M and its inverse, each worker's sender and decoder rows, the predicted
error and the error the design is held to (``checked_error``). ``unity`` and ``vandermonde``
build a design from eps; ``search`` chooses eps, or the points, for a dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import ClassVar

import numpy as np
import scipy.linalg

from ...errors import ConfigError
from .blas import _one_blas_thread
from .limits import SCALES, UNIT_ROUNDOFF

# float16: fp16 packets (``compression="fp16"`` over CERAR); its 11-bit rounding, amplified by
# cond(M), leaves c > N designs at 2% error at best, so the default max_error refuses them


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

    name: ClassVar[str] = "cerar"        # the codec's key in gradsync.coding.CODECS and codec dicts
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
        """The design as a schedule's ``codec`` dict (plain JSON data); ``from_dict`` reads it back.

        >>> Design.from_dict(unity(4, 6, 1e-3).to_dict()).eps
        0.001
        """
        return {"name": self.name, "workers": self.workers, "components": self.components,
                "points": [[float(p.real), float(p.imag)] for p in self.points],
                "construction": self.construction, "eps": self.eps, "scale": self.scale,
                "params": self.params}

    @classmethod
    def from_dict(cls, data: dict) -> "Design":
        points = np.array([complex(re, im) for re, im in data["points"]])
        return cls(int(data["workers"]), int(data["components"]), points, data.get("construction", "unity"),
                   data.get("eps"), data.get("scale", "none"), dict(data.get("params") or {}))


# --- the components, and the ring run batched over workers (for ``checked_error``) -------------
# Both live here, not in codec.py beside ``Worker``: ``checked_error`` needs them, and the codec
# builds on the design.

def split(flat: np.ndarray, components: int) -> np.ndarray:
    """Zero-pad a worker's d elements to c x m components.

    >>> split(np.arange(5.0), 2)
    array([[0., 1., 2.],
           [3., 4., 0.]])
    """
    m = -(-flat.shape[-1] // components)
    out = np.zeros(flat.shape[:-1] + (components * m,), flat.dtype)
    out[..., :flat.shape[-1]] = flat
    return out.reshape(flat.shape[:-1] + (components, m))


def _run_batched(design: Design, inputs: np.ndarray, chunk: int = 16) -> np.ndarray:
    """``emulate``'s estimates with all N workers in each numpy call, for ``checked_error``:
    the same products in the same dtype as ``codec.Worker`` (bit for bit), 30x faster at N = 64.
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

