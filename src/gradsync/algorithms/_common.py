"""Checks and cost parameters shared by the algorithm modules."""

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Net:
    """Alpha-beta-gamma parameters of a network, for the closed-form costs.

    alpha: seconds per message between two workers (route latency); beta: seconds per byte on
    a worker's link (1 / bandwidth); gamma: seconds per element reduced (or multiply-add) on a
    worker; mu: seconds per multiply-add in matrix products (codecs). ``host_*`` are the same
    for worker <-> host traffic and the host's own compute.
    ``ring_betas`` gives one beta per ring when ring all-reduce runs several rings at once.
    """

    alpha: float
    beta: float
    gamma: float = 0.0
    mu: float = 0.0
    host_alpha: float | None = None
    host_beta: float | None = None
    host_gamma: float | None = None
    ring_betas: tuple[float, ...] = ()


def check_size(workers, elements) -> tuple[int, int]:
    """Validate the two arguments every ``schedule`` function takes."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 0:
        raise ConfigError(f"elements must be an integer >= 0, got {elements!r}")
    return workers, elements


def check_worker(name: str, value, workers: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < workers:
        raise ConfigError(f"{name} must be a worker index in 0..{workers - 1}, got {value!r}")
    return value
