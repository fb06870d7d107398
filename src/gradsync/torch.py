"""DistributedDataParallel communication hooks that synchronize with gradsync algorithms."""

from __future__ import annotations

import torch

from .runtime.api import all_reduce


def comm_hook(algorithm: str = "ring", timeout: float | None = None, **options):
    """A hook for ``DistributedDataParallel.register_comm_hook`` averaging each gradient bucket
    with ``algorithm`` (exact ones, or "cerar" with its options).

    ``state`` passed at registration is the process group (or None for the default one).

    Example::

        model = DistributedDataParallel(net)
        model.register_comm_hook(None, comm_hook("halving_doubling"))
    """
    def hook(state, bucket):
        tensor = bucket.buffer()
        all_reduce(tensor, algorithm=algorithm, op="avg", group=state, timeout=timeout, **options)
        future = torch.futures.Future()
        future.set_result(tensor)
        return future

    hook.__name__ = f"gradsync_{algorithm}_hook"
    return hook
