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
    ``local_*``: alpha and beta between workers of one machine, when workers are grouped into
    machines (hierarchical algorithms); alpha and beta are then those across machines.
    ``switch_*``: alpha and beta between a worker and the switch that reduces (NVLS, SHARP),
    beta at the switch's share of the link. ``base``: seconds once per collective (a GPU
    protocol's launch and set-up), which ``model.cost.predict`` adds to every closed form.
    ``posted``: the sender does not wait for the receiver (NCCL), so pipelined algorithms pay a
    step's latency once per stage of their depth, not per round.
    """

    alpha: float
    beta: float
    gamma: float = 0.0
    mu: float = 0.0
    host_alpha: float | None = None
    host_beta: float | None = None
    host_gamma: float | None = None
    ring_betas: tuple[float, ...] = ()
    local_alpha: float | None = None
    local_beta: float | None = None
    switch_alpha: float | None = None
    switch_beta: float | None = None
    switch_base: float = 0.0        # the reducing switch's own set-up, once per collective (NVLS: 25 us)
    base: float = 0.0
    posted: bool = False            # sends are posted (a GPU machine): a pipeline pays its latencies once along
                                    # its depth, not once per round


MAX_WORKERS = 65536       # the largest ethernet preset
MAX_ELEMENTS = 1 << 40    # offsets stay far inside int64 in every schedule's arithmetic


def check_size(workers, elements) -> tuple[int, int]:
    """Validate the two arguments every ``schedule`` function takes: ``check_size(4, 0) == (4, 0)``.

    One worker and zero elements are valid trivial cases: the schedule moves nothing.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be an integer in 1..{MAX_WORKERS}, got {workers!r}")
    if isinstance(elements, bool) or not isinstance(elements, int) or not 0 <= elements <= MAX_ELEMENTS:
        raise ConfigError(f"elements must be an integer in 0..2**40, got {elements!r}")
    return workers, elements


def check_worker(name: str, value, workers: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < workers:
        raise ConfigError(f"{name} must be a worker index in 0..{workers - 1}, got {value!r}")
    return value
