"""One BLAS thread at a time for CERAR's dense linear algebra: a process-wide limit, one lock."""

from __future__ import annotations

import contextlib
import threading
from functools import lru_cache

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

