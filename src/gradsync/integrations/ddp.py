"""DistributedDataParallel communication hooks that synchronize with gradsync algorithms."""

from __future__ import annotations

from .. import algorithms
from ..errors import ConfigError
from ..runtime import flight
from ..runtime.api import all_reduce

# the hook's own keywords; every other keyword is the algorithm's option
HOOK_OPTIONS = ("timeout", "trace", "compression", "transport")


def _check(algorithm: str, timeout, transport: str, options: dict) -> None:
    """Refuse, when the hook is made, what its first bucket would refuse: an unknown algorithm,
    an option it does not take (naming the hook's own options beside the algorithm's), a bad
    value, a transport or a timeout. ``_check("ring", None, "auto", {})`` passes."""
    from ..runtime.transport import check_choice

    check_choice(transport)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < 1e7):
        raise ConfigError(f"comm_hook: timeout must be a positive number of seconds, got {timeout!r}")
    if algorithm == "auto":
        if options:
            raise ConfigError(f"comm_hook: bad option {next(iter(options))!r}: algorithm 'auto' takes no "
                              f"options; the hook's own are {', '.join(HOOK_OPTIONS)}")
        return
    spec = algorithms.get(algorithm)
    unknown = [key for key in options if key not in spec.options]
    if unknown:
        theirs = ", ".join(spec.options) or "none"
        raise ConfigError(f"comm_hook: bad option {unknown[0]!r}: the hook takes {', '.join(HOOK_OPTIONS)}, "
                          f"and algorithm {algorithm!r} takes {theirs}")
    spec.check_options(options)


def comm_hook(algorithm: str = "ring", timeout: float | None = None, trace=None, compression=None,
              transport: str = "auto", **options):
    """A hook for ``DistributedDataParallel.register_comm_hook`` averaging each gradient bucket
    with ``algorithm`` (exact ones, "auto", or "cerar" with its options).

    The hook starts the bucket's all-reduce and returns its future at once, without waiting:
    the collective runs on gradsync's progress thread while backward goes on computing the
    next buckets, as DDP's own all-reduce does. ``state`` passed at registration is the
    process group (or None for the default one). ``trace``: a ``gradsync.runtime.tracing.Trace``
    recording every bucket's all-reduce. ``transport``: what the buckets travel over, as
    ``gradsync.all_reduce`` takes it: "gloo" (the group's backend), "shm" (shared memory, every
    rank on this host, CPU tensors) or "auto" (shared memory where the ranks share a host).

    ``compression`` (``gradsync.compression``: "fp16", "bf16", "powersgd:rank=4",
    "topk:ratio=0.01", "sign") compresses each bucket, the algorithm running the codec's
    payload; the hook keeps one codec, so error feedback and warm starts carry over per bucket.

    Every argument is checked here, when the hook is made: a misspelt keyword is a
    ``ConfigError`` naming the hook's options and the algorithm's, not a failure at the first
    ``backward()``.

    Example::

        model = DistributedDataParallel(net)
        model.register_comm_hook(None, comm_hook("halving_doubling"))
        model.register_comm_hook(None, comm_hook("ring", transport="auto", compression="powersgd:rank=4"))

    >>> comm_hook("ring", tansport="auto")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gradsync.errors.ConfigError: comm_hook: bad option 'tansport': the hook takes timeout, trace, compression, transport, and algorithm 'ring' takes ...
    """
    _check(algorithm, timeout, transport, options)
    codec = None
    if compression is not None:
        from ..compression import make
        codec = make(compression)
    flight.watch_signal()                 # made in the main thread, where a signal handler can go

    def hook(state, bucket):   # no annotation: DDP compares it with the evaluated Future[Tensor]
        extra = {} if codec is None else {"compression": codec, "compression_key": bucket.index()}
        if codec is not None:                    # PowerSGD: a matrix per weight; sign: a scale per tensor
            codec.layout(bucket.index(), [g.shape for g in bucket.gradients()])
        work = all_reduce(bucket.buffer(), algorithm=algorithm, op="avg", group=state, timeout=timeout,
                          async_op=True, trace=trace, transport=transport, **extra, **options)
        return work.get_future()

    hook.__name__ = f"gradsync_{algorithm}_hook" + (f"_{codec.name}" if codec is not None else "")
    return hook
