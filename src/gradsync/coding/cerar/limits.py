"""CERAR's names and limits that the algorithm's options need at import time, apart from the
modules that compute designs (which load scipy: about 0.6 s of every command's start).

>>> "unity" in CONSTRUCTIONS
True
"""

CONSTRUCTIONS = ("unity", "vandermonde", "optimized")
SCALES = ("none", "midpoint", "per_worker")
UNIT_ROUNDOFF = {"float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
DEFAULT_MAX_ERROR = 1e-2
