"""gradsync as a torch.distributed backend: ``dist.init_process_group("gradsync")``.

Training code that calls torch.distributed (DDP, FSDP2's ``fully_shard``, DeviceMesh,
``new_group``) runs on gradsync's schedules by changing the backend string. ``register()``
tells torch.distributed the name "gradsync" (CPU tensors; with "cpu:gradsync,cuda:nccl" CUDA
tensors go to NCCL); ``install()`` does it as soon as torch.distributed is imported, and costs
nothing before (gradsync itself works without torch). ``configure`` sets which algorithm each
collective uses (``config``); ``group.GradsyncGroup`` is the process group, which forwards
each typed call to its communicator (``gradsync.runtime.communicator``); ``table(group)`` shows
what ``auto`` measured and chose there.

Example, in each rank under torchrun::

    import gradsync.distributed
    gradsync.distributed.register()
    dist.init_process_group("gradsync")
    model = DistributedDataParallel(net)          # its all-reduces are gradsync's
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from .config import configure, current, trace

NAME = "gradsync"
_TORCH_DISTRIBUTED = "torch.distributed"


def register() -> bool:
    """Make "gradsync" a torch.distributed backend (once; later calls do nothing). True if it
    is registered now. Example: ``register()`` then ``dist.init_process_group("gradsync")``."""
    dist = sys.modules.get(_TORCH_DISTRIBUTED)
    if dist is None or not hasattr(dist, "Backend"):        # not imported yet, or half-way through its import
        import torch.distributed as dist
    if not dist.is_available():
        return False
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    return True


def _create(opts, backend_options=None):
    """The creator torch.distributed calls for a "gradsync" group (see ``group.create``)."""
    from .group import create

    return create(opts, backend_options)


def install() -> None:
    """Register as soon as torch.distributed is imported: now if it already is, else when it
    is (a hook on the import system that removes itself after). What ``import gradsync`` calls;
    nothing is imported here.

    Example: ``install()``, then ``import torch.distributed as dist; dist.init_process_group("gradsync")``.
    """
    if _TORCH_DISTRIBUTED in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch.distributed is being imported, wraps its loader so that
    ``register()`` runs right after the module has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != _TORCH_DISTRIBUTED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def table(group=None) -> list[dict]:
    """What ``auto`` measured on a gradsync group and chose, one row per collective and size
    ({"collective", "bytes", "choice", "seconds": {candidate: median}}): the table behind each
    verdict. Example, in each rank after a training step: ``table()[0]["choice"]``.
    """
    import torch.distributed as dist

    from ..runtime import choice

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    comm = pg.communicator() if callable(getattr(pg, "communicator", None)) else None
    return [] if comm is None else choice.table(comm)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """Gloo's monitored barrier on a gradsync group: every rank reports to rank 0, which raises
    naming the ranks that did not within ``timeout`` (a ``datetime.timedelta``; the group's by
    default). ``torch.distributed.monitored_barrier`` refuses every backend but Gloo before any
    backend sees the call, so gradsync offers it here. Example, in each rank: ``monitored_barrier()``.
    """
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not hasattr(pg, "monitored_barrier") or not hasattr(pg, "engines"):
        dist.monitored_barrier(group, timeout, wait_all_ranks)
        return
    pg.monitored_barrier(timeout, wait_all_ranks)


def __getattr__(name):
    """``RankFailure`` (the error a dead rank gives) loads torch, so it is imported on first use."""
    if name == "RankFailure":
        from .work import RankFailure
        return RankFailure
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAME", "RankFailure", "configure", "current", "install", "monitored_barrier", "register", "table",
           "trace"]
