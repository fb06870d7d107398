"""``GradsyncGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run gradsync's schedules.

torch.distributed calls its methods (``allreduce``, ``reduce_scatter_single``, ...) with its
own tensors and options; each becomes one ``route.Call`` and goes through ``route.route``, the
one place that decides how it runs. Underneath lies the engine, a Gloo backend on the same
store (and NCCL for CUDA tensors where there is one): gradsync's own messages travel over its
send and receive, and what the schedules do not express runs on it directly.

The engine is also registered as the group's CPU backend: ``ProcessGroup`` keeps its name
there, and DeviceMesh, FSDP2 and the functional collectives read ``group_name`` (with no
backend registered, "ProcessGroup name not set"). Collectives still come to this class: a
Python subclass's methods are what torch calls.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from . import config
from .route import Call, route

BACKEND = "gradsync"


class GradsyncGroup(dist.ProcessGroup):
    """The process group of ``init_process_group("gradsync")`` / ``new_group(backend="gradsync")``.

    Args:
        store: the group's store (prefixed by torch for this group).
        rank, size: this process's rank in the group and the group's size.
        timeout: the group's timeout; a dead or stalled peer fails a collective within it.
        choices: kind -> "auto", "engine" or an algorithm; by default the process's choices as
            ``configure`` and GRADSYNC_ALGORITHMS set them, read at each collective (a bad
            GRADSYNC_ALGORITHMS fails here, at the group's creation).

    Example, in each rank (after ``import gradsync.distributed``)::

        dist.init_process_group("gradsync")                  # or "cpu:gradsync,cuda:nccl"
        dist.all_reduce(torch.ones(4))                        # a gradsync schedule
    """

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, choices: dict | None = None):
        super().__init__(rank, size)
        self.timeout = timeout.total_seconds()
        config.current()                   # a bad GRADSYNC_ALGORITHMS is refused now, not mid-training
        self._choices = None if choices is None else {k: config.check(k, v) for k, v in choices.items()}
        self._store = store
        # under torchrun's elastic agent the store outlives a restart: the keys of a dead attempt's
        # engine must not be read by the next one (they name listeners that are gone)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.engines = {"cpu": dist.ProcessGroupGloo(dist.PrefixStore(f"gradsync/gloo/{attempt}/", store), rank,
                                                     size, timeout)}
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self.engines["cpu"])
        if torch.cuda.is_available() and dist.is_nccl_available():     # CUDA tensors go to NCCL
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore(f"gradsync/nccl/{attempt}/", store), rank, size)
            self.engines["cuda"] = nccl
            self._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
        self._over = None                  # "auto" transport, once settled (schedule_transport)
        self.key = None                    # its key in runtime.state, once torch has registered it
        self.auto_verdicts: dict = {}      # kind -> verdict per size, measured at first use (auto.py)
        self.closed = False

    @property
    def choices(self) -> dict:
        """kind -> its choice now ("auto", "engine" or an algorithm)."""
        return config.current() if self._choices is None else {**config.current(), **self._choices}

    def schedule_transport(self) -> str:
        """What the schedules' messages travel over now: "gloo" or "shm". The choice "auto" is
        settled once per group, by every rank together at its first schedule (shared memory
        if the ranks share one host and can all map a segment: the same answer on every rank)."""
        choice = self.choices["transport"]
        if choice != "auto":
            return choice
        if self._over is None:
            from ..runtime.transport import shared_group

            if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
                self._over = "gloo"    # a restarted attempt: the dead one's set-up keys are still in the store
            else:
                self._over = "gloo" if isinstance(shared_group(self, self.timeout), str) else "shm"
        return self._over

    def engine(self, device: torch.device):
        """The engine backend for tensors on ``device`` (Gloo for CPU, NCCL for CUDA)."""
        kind = device.type if device.type in self.engines else "cpu"
        return self.engines[kind]

    def getBackendName(self) -> str:
        return BACKEND

    @property
    def _device_types(self):
        return [torch.device(d) for d in self.engines]

    # --- collectives gradsync's schedules run (when routed so) -------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        return route(self, Call("all_reduce", tensors, tensors, opts, op=opts.reduceOp))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return route(self, Call("reduce_scatter", [output], [input], opts, op=opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return route(self, Call("reduce_scatter_list", outputs, input_lists, opts, op=opts.reduceOp))

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return route(self, Call("reduce_scatter", outputs, inputs, opts, op=opts.reduceOp))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_gather_single(self, output, input, opts=None):
        return route(self, Call("all_gather", [output], [input], opts))

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        return route(self, Call("all_gather_list", output_lists, inputs, opts))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return route(self, Call("all_gather", outputs, inputs, opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return route(self, Call("broadcast", tensors, tensors, opts, root=opts.rootRank))

    def barrier(self, opts=None):
        return route(self, Call("barrier", [], [], opts if opts is not None else dist.BarrierOptions()))

    # --- collectives the engine runs ---------------------------------------------------------
    def allreduce_coalesced(self, tensors, opts=None):
        return route(self, Call("engine", tensors, tensors, opts, method="allreduce_coalesced"))

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return route(self, Call("engine", [output], [input], opts, method="alltoall_base",
                                extra=(output_splits, input_splits)))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        return route(self, Call("engine", outputs, inputs, opts, method="alltoall"))

    def send(self, tensors, dst: int, tag: int):
        return self.engine(tensors[0].device).send(tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int):
        return self.engine(tensors[0].device).recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag: int):
        return self.engine(tensors[0].device).recv_anysource(tensors, tag)

    def gather(self, outputs, inputs, opts=None):
        return route(self, Call("engine", outputs, inputs, opts, method="gather"))

    def scatter(self, outputs, inputs, opts=None):
        return route(self, Call("engine", outputs, inputs, opts, method="scatter"))

    def reduce(self, tensors, opts=None):
        return route(self, Call("engine", tensors, tensors, opts, method="reduce"))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self.engines["cpu"].monitored_barrier(timeout, wait_all_ranks)

    # --- ending ------------------------------------------------------------------------------
    def abort(self) -> None:
        """Abort the engines' pending operations: collectives waiting on them fail at once."""
        self._end("abort")

    def shutdown(self) -> None:
        """Release the engines (called by ``destroy_process_group``)."""
        self._end("shutdown")

    def _end(self, how: str) -> None:
        if self.closed:
            return
        self.closed = True
        from ..runtime.state import STATE
        from ..runtime.transport.base import group_key

        try:                                 # the progress thread and whatever else the runtime kept
            STATE.forget(self.key or group_key(self))
        except (RuntimeError, ValueError):   # torch has unregistered it already: nothing was kept
            pass
        for engine in self.engines.values():
            end = getattr(engine, how, None) or getattr(engine, "abort", None)
            if end is not None:
                try:
                    end()
                except RuntimeError:          # an engine that cannot abort (Gloo before 2.6): its
                    pass                      # sockets close when it is freed


def create(opts, backend_options=None) -> GradsyncGroup:
    """The creator torch.distributed calls (``extended_api=True``): ``opts`` carries the
    group's store, rank, size and timeout. The algorithm choices are read here, so a bad
    GRADSYNC_ALGORITHMS fails ``init_process_group`` with a ConfigError naming it.

    Example: ``dist.Backend.register_backend("gradsync", create, extended_api=True, devices=["cpu"])``.
    """
    return GradsyncGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)
