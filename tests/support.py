"""Helpers shared by the tests."""

import numpy as np

PRIMES = (2, 3, 5, 7, 13, 31, 97)


def random_inputs(rng, workers, length, dtype):
    """One array per worker: integers in a small range, or normal floats."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal((workers, length)).astype(dtype)
    return rng.integers(-1000, 1000, size=(workers, length)).astype(dtype)
