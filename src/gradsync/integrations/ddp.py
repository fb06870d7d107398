"""DistributedDataParallel communication hooks that synchronize with gradsync algorithms."""

from __future__ import annotations

from ..runtime import flight
from ..runtime.api import all_reduce


def comm_hook(algorithm: str = "ring", timeout: float | None = None, trace=None, compression=None, **options):
    """A hook for ``DistributedDataParallel.register_comm_hook`` averaging each gradient bucket
    with ``algorithm`` (exact ones, "auto", or "cerar" with its options).

    The hook starts the bucket's all-reduce and returns its future at once, without waiting:
    the collective runs on gradsync's progress thread while backward goes on computing the
    next buckets, as DDP's own all-reduce does. ``state`` passed at registration is the
    process group (or None for the default one). ``trace``: a ``gradsync.runtime.tracing.Trace``
    recording every bucket's all-reduce.

    ``compression`` (``gradsync.compression``: "fp16", "bf16", "powersgd:rank=4",
    "topk:ratio=0.01", "sign") compresses each bucket, the algorithm running the codec's
    payload; the hook keeps one codec, so error feedback and warm starts carry over per bucket.

    Example::

        model = DistributedDataParallel(net)
        model.register_comm_hook(None, comm_hook("halving_doubling"))
        model.register_comm_hook(None, comm_hook("ring", compression="powersgd:rank=4"))
    """
    flight.watch_signal()                 # made in the main thread, where a signal handler can go
    codec = None
    if compression is not None:
        from ..compression import make
        codec = make(compression)

    def hook(state, bucket):   # no annotation: DDP compares it with the evaluated Future[Tensor]
        extra = {} if codec is None else {"compression": codec, "compression_key": bucket.index()}
        if codec is not None:                    # PowerSGD: a matrix per weight; sign: a scale per tensor
            codec.layout(bucket.index(), [g.shape for g in bucket.gradients()])
        work = all_reduce(bucket.buffer(), algorithm=algorithm, op="avg", group=state, timeout=timeout,
                          async_op=True, trace=trace, **extra, **options)
        return work.get_future()

    hook.__name__ = f"gradsync_{algorithm}_hook" + (f"_{codec.name}" if codec is not None else "")
    return hook
