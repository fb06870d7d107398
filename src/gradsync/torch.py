"""DistributedDataParallel communication hooks that synchronize with gradsync algorithms."""

from __future__ import annotations

from .runtime.api import all_reduce


def comm_hook(algorithm: str = "ring", timeout: float | None = None, trace=None, **options):
    """A hook for ``DistributedDataParallel.register_comm_hook`` averaging each gradient bucket
    with ``algorithm`` (exact ones, "auto", or "cerar" with its options).

    The hook starts the bucket's all-reduce and returns its future at once, without waiting:
    the collective runs on gradsync's progress thread while backward goes on computing the
    next buckets, as DDP's own all-reduce does. ``state`` passed at registration is the
    process group (or None for the default one). ``trace``: a ``gradsync.runtime.tracing.Trace``
    recording every bucket's all-reduce.

    Example::

        model = DistributedDataParallel(net)
        model.register_comm_hook(None, comm_hook("halving_doubling"))
    """
    def hook(state, bucket):   # no annotation: DDP compares it with the evaluated Future[Tensor]
        work = all_reduce(bucket.buffer(), algorithm=algorithm, op="avg", group=state, timeout=timeout,
                          async_op=True, trace=trace, **options)
        return work.get_future()

    hook.__name__ = f"gradsync_{algorithm}_hook"
    return hook
