"""CERAR: coded approximate ring all-reduce (Munim and Ramamoorthy), its designs and its codec.

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

The modules, each building on the ones before it:

- ``designs``: ``Design`` (the points; M, encoders, decoders, the predicted and checked error)
  and the plain constructions ``unity`` and ``vandermonde``;
- ``search``: choosing a design for a dtype (``best``, ``make``, the refusal ``check_error``);
- ``codec``: the per-worker codec ``Worker`` and the runs that emulate it (``run``,
  ``emulate``, ``measure``), and the codec registry's calls (``design``, ``worker``);
- ``blas``: the one-BLAS-thread limit the error checks and searches run under.

Every public name is re-exported here: ``cerar.make(8, 16)``, ``cerar.Design``, ``cerar.Worker``
(loaded on first use: they load scipy, which every command would otherwise pay for at start).

>>> from gradsync.coding.cerar import make
>>> make(8, 16).rounds
22
"""

from .limits import CONSTRUCTIONS, DEFAULT_MAX_ERROR, SCALES, UNIT_ROUNDOFF

# The rest load on first use (they load scipy): which module holds each name.
_WHERE = {**dict.fromkeys(("Run", "Worker", "design", "emulate", "emulate_schedule", "measure", "run",
                           "verify_schedule", "worker"), "codec"),
          **dict.fromkeys(("Design", "split", "unity", "vandermonde"), "designs"),
          **dict.fromkeys(("best", "check_error", "default_max_cond", "largest_components", "make", "optimized",
                           "unity_at_cond", "unity_best", "vandermonde_best"), "search")}


def __getattr__(name):
    """``cerar.make``, ``cerar.Design`` ...: imported from their module the first time."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


__all__ = ["CONSTRUCTIONS", "DEFAULT_MAX_ERROR", "SCALES", "UNIT_ROUNDOFF", "Design", "Run", "Worker", "best",
           "check_error", "default_max_cond", "design", "emulate", "emulate_schedule", "largest_components",
           "make", "measure", "optimized", "run", "split", "unity", "unity_at_cond", "unity_best",
           "vandermonde", "vandermonde_best", "verify_schedule", "worker"]
