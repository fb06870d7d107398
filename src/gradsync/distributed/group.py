"""``GradsyncGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run through gradsync's
communicator.

torch calls its typed methods (``allreduce``, ``reduce_scatter_single``, ...) with its own
tensors and options; each method forwards the call as it came, typed, to the group's
``runtime.communicator.Communicator`` (``all_reduce``, ``reduce_scatter``, ``all_gather``,
``broadcast``, ``barrier``), which chooses and runs it. Underneath lies the engine, a Gloo
backend on the same store (and NCCL for CUDA tensors where there is one): gradsync's own
messages travel over its send and receive, and it is one of the candidates the choice weighs.

Whatever the communicator has no reason to run differently from Gloo goes to the engine with
torch's own arguments, so that it behaves exactly as Gloo does, errors and futures included:
the other forms of a call torch's bindings accept (a bare tensor, an op instead of options),
several tensors in one call, lists of unequal tensors, sparse, meta, CUDA and empty tensors,
out-of-range roots, and the collectives gradsync has no schedule for (all_to_all, gather,
scatter, reduce, coalesced all-reduce, send and receive).

The engine is also registered as the group's CPU backend: ``ProcessGroup`` keeps its name
there, and DeviceMesh, FSDP2 and the functional collectives read ``group_name`` (with no
backend registered, "ProcessGroup name not set"). Collectives still come to this class: a
Python subclass's methods are what torch calls.
"""

from __future__ import annotations

import atexit
import datetime
import os
import time
import weakref

import torch
import torch.distributed as dist

from ..runtime.engines import TorchEngine
from ..runtime.flight import RECORDER
from ..runtime.transport.base import group_key
from . import config, gradients
from .arguments import (COLLECTIVE_OF, REDUCE_OPS, AllgatherOptions, AllreduceOptions, BroadcastOptions,
                        ReduceScatterOptions, even, first_tensor, options_with, plain, queued, scatter_into,
                        subgroup_timeout)
from .gloo_engine import make_gloo
from .work import EngineWork, Joined, Then, Work, in_torch_terms

BACKEND = "gradsync"


_settling: list = []         # whether the exit hook is registered (once per process)


def _settle_engines() -> None:
    """At exit, before teardown: 50 ms for Gloo's threads to drop the operations they finished.
    The last reference to one, dropped during teardown, needs a GIL that no longer exists and
    aborts the process after the script's last line: a failed job to torchrun (reliability.md)."""
    time.sleep(0.05)


class GradsyncGroup(dist.ProcessGroup):
    """The process group of ``init_process_group("gradsync")`` / ``new_group(backend="gradsync")``.

    Args:
        store: the group's store (prefixed by torch for this group).
        rank, size: this process's rank in the group and the group's size.
        timeout: the group's timeout; a dead or stalled peer fails a collective within it.
        choices: kind -> "auto", "engine" or an algorithm; by default the process's choices as
            ``configure`` and GRADSYNC_ALGORITHMS set them (a bad GRADSYNC_ALGORITHMS fails
            here, at the group's creation; ``configure`` takes effect at the next call).

    Example, in each rank (after ``import gradsync.distributed``)::

        dist.init_process_group("gradsync")                  # or "cpu:gradsync,cuda:nccl"
        dist.all_reduce(torch.ones(4))                        # gradsync's choice of how
    """

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, choices: dict | None = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size      # torch's size() costs microseconds through its bindings
        self.timeout = timeout.total_seconds()
        self._fixed = None if choices is None else {k: config.check(k, v) for k, v in choices.items()}
        self._gradients = None             # approximate gradient sync (``gradients.Gradients``), or None: exact
        self._choices, self._version = self._read_choices(), config.version()
        self._store = store
        # under torchrun's elastic agent the store outlives a restart: the keys of a dead attempt's
        # engine must not be read by the next one (they name listeners that are gone)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.engines = {"cpu": make_gloo(store, f"gradsync/gloo/{attempt}/", rank, size, timeout)}
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self.engines["cpu"])
        if torch.cuda.is_available() and dist.is_nccl_available():     # CUDA tensors go to NCCL
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore(f"gradsync/nccl/{attempt}/", store), rank, size)
            self.engines["cuda"] = nccl
            self._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
        if not _settling:
            _settling.append(atexit.register(_settle_engines))
        self._comm = None                  # the communicator, made at the first collective (torch knows the group by then)
        self._global = None                # its ranks in the world, for a subgroup (``global_ranks``)
        self.closed = False

    # --- choices and the communicator ----------------------------------------------------------

    def _read_choices(self) -> dict:
        current = config.current()        # a bad GRADSYNC_ALGORITHMS is refused here, not mid-training
        current = current if self._fixed is None else {**current, **self._fixed}
        self._gradients = gradients.for_group(current["gradients"], self, self._size, self._gradients)
        return current

    @property
    def choices(self) -> dict:
        """kind -> its choice now ("auto", "engine", "one_host" or an algorithm)."""
        if self._version != config.VERSION[0]:        # read, not called: the hot path's one look at config
            self._choices, self._version = self._read_choices(), config.VERSION[0]
        return self._choices

    def communicator(self):
        """The group's communicator (made at its first collective)."""
        comm = self._comm
        if comm is None:
            if self.closed:
                raise dist.DistBackendError(f"the gradsync process group {self.group_name} was shut down or aborted")
            from ..runtime.communicator import Communicator

            comm = self._comm = Communicator(self, TorchEngine(self.engines["cpu"]), self.timeout,
                                             self.choices["transport"])
            self.global_ranks()
        return comm

    def _run(self, kind: str, call, tensors: tuple, nbytes: int, result, opts):
        """Run a typed call on the communicator; torch's ``Work`` for it."""
        comm = self._comm or self.communicator()
        comm.trace = config.TRACE[0]
        choices = self._choices if self._version == config.VERSION[0] else self.choices
        algorithm = choices[kind]
        try:
            out = call(comm, algorithm, queued(nbytes, opts))
        except BaseException as exc:         # refused at once, or the group had failed: torch's error
            raise in_torch_terms(exc, self.global_ranks()) from None
        return Work(out if not isinstance(out, (torch.Tensor, type(None))) else None, result, self._global)

    def global_ranks(self) -> tuple | None:
        """The group's ranks in the world (None for the world itself, where they are the same):
        failures name ranks by them."""
        if self._global is None and self._comm is not None and self._comm.key != "torch/world":
            self._global = tuple(dist.get_process_group_ranks(self))
        return self._global

    def engine(self, device: torch.device):
        """The engine backend for tensors on ``device`` (Gloo for CPU, NCCL for CUDA)."""
        kind = device.type if device.type in self.engines else "cpu"
        return self.engines[kind]

    def _engine(self, method: str, tensor, *args, **kwargs):
        """torch's call as it came, on the engine (exactly Gloo's behaviour, its failures named),
        recorded in the flight recorder as "engine:<name>/<collective>". Meta tensors have no
        data: the call completes at once, as torch's own dispatch of them does."""
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return Work(None, args[0] if args and isinstance(args[0], list) else [tensor])
        engine = self.engine(tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu"))
        work = getattr(engine, method)(*args, **kwargs)
        if engine is not self.engines["cpu"]:      # NCCL orders streams in its own Work: keep it
            return work
        kind = COLLECTIVE_OF.get(method, method)
        entry = None
        if self._comm is not None or not self.closed:
            tensor = tensor if isinstance(tensor, torch.Tensor) else None
            entry = RECORDER.begin(self._key(), self._rank, self._size, f"engine:gloo/{kind}",
                                   0 if tensor is None else tensor.numel(), 1 if tensor is None else tensor.element_size(),
                                   None if tensor is None else tensor.dtype)
        return EngineWork(work, weakref.ref(self), f"gloo's {kind}", entry, self._global)

    def _key(self) -> str:
        comm = self._comm
        if comm is not None:
            return comm.key
        try:
            return group_key(self)
        except (RuntimeError, ValueError):         # not registered in torch's world (yet)
            return "torch/unregistered"

    def getBackendName(self) -> str:
        return BACKEND

    @property
    def options(self):
        """The engine's options, as Gloo's group offers them (``options._timeout``: the group's timeout)."""
        return self.engines["cpu"].options

    def _set_default_timeout(self, timeout: datetime.timedelta) -> None:
        """A new timeout for the group's collectives, as Gloo's group takes one: the engine's, and
        the bound within which gradsync names a failed peer."""
        self.engines["cpu"]._set_default_timeout(timeout)
        self.timeout = timeout.total_seconds()
        if self._comm is not None:
            self._comm.timeout = self.timeout

    @property
    def _device_types(self):
        return [torch.device(d) for d in self.engines]

    # --- the collectives gradsync runs -------------------------------------------------------

    def allreduce(self, tensors, opts=None, op=None, timeout=None):
        if type(opts) is not AllreduceOptions or type(tensors) is not list:      # torch's other forms
            tensors = [tensors] if isinstance(tensors, torch.Tensor) else tensors
            opts = opts if isinstance(opts, AllreduceOptions) else \
                options_with(AllreduceOptions, reduceOp=opts if opts is not None else op, timeout=timeout)
        if len(tensors) != 1 or not plain(tensors[0]):
            return self._engine("allreduce", tensors[0] if tensors else None, tensors, opts)
        if self._size == 1 and not self.closed:      # every op of one rank is the tensor itself
            return Work(None, tensors)
        t, name = tensors[0], REDUCE_OPS.get(hash(opts.reduceOp))
        if name is None:                   # PREMUL_SUM and ops to come: the engine's
            return self._engine("allreduce", t, tensors, opts)
        comm = self._comm or self.communicator()
        comm.trace = config.TRACE[0]
        choices = self._choices if self._version == config.VERSION[0] else self.choices
        approximate = self._gradients
        try:
            if approximate is not None and approximate.wanted("all_reduce", t, name):
                out = approximate.all_reduce(t, name, queued(t.numel() * t.element_size(), opts))
                return Work(out, tensors, self._global)
            out = comm.all_reduce(t, name, choices["all_reduce"], queued(t.numel() * t.element_size(), opts))
        except BaseException as exc:         # refused at once, or the group had failed: torch's error
            raise in_torch_terms(exc, self.global_ranks()) from None
        return Work(None if out is t else out, tensors, self._global)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        name = REDUCE_OPS.get(hash(opts.reduceOp))
        if not (plain(output) and plain(input)) or name is None or output.dtype != input.dtype \
                or input.numel() != output.numel() * self._size or self._size == 1:
            return self._engine("_reduce_scatter_base", output, output, input, opts)
        approximate = self._gradients
        if approximate is not None and approximate.wanted("reduce_scatter", input, name):
            call = lambda c, a, q: approximate.reduce_scatter(output, input, name, c, a, q)   # noqa: E731
        else:
            call = lambda c, a, q: c.reduce_scatter(output, input, name, a, q)                # noqa: E731
        return self._run("reduce_scatter", call, (output, input), input.numel() * input.element_size(), [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None, op=None, timeout=None):
        if isinstance(outputs, torch.Tensor):          # reduce_scatter(output, [inputs], op)
            outputs, input_lists = [outputs], [input_lists]
            opts = options_with(ReduceScatterOptions, reduceOp=opts if opts is not None else op, timeout=timeout)
        opts = opts if opts is not None else ReduceScatterOptions()
        name = REDUCE_OPS.get(hash(opts.reduceOp))
        if len(outputs) != 1 or len(input_lists) != 1 or name is None or not even(outputs[0], input_lists[0],
                                                                                  self._size):
            return self._engine("reduce_scatter", outputs[0] if outputs else None, outputs, input_lists, opts)
        out, whole = outputs[0], torch.cat([x.reshape(-1) for x in input_lists[0]])
        return self._run("reduce_scatter", lambda c, a, q: c.reduce_scatter(out, whole, name, a, q),
                         (out, whole), whole.numel() * whole.element_size(), outputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """Each pair's reduce-scatter, in order (Gloo has no coalesced form of it)."""
        return Joined([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        if not (plain(output) and plain(input)) or output.dtype != input.dtype \
                or output.numel() != input.numel() * self._size or self._size == 1:
            return self._engine("_allgather_base", output, output, input, opts)
        return self._run("all_gather", lambda c, a, q: c.all_gather(output, input, a, q), (output, input),
                         output.numel() * output.element_size(), [output], opts)

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None, timeout=None):
        if isinstance(inputs, torch.Tensor):            # allgather([outputs], input)
            output_lists, inputs = [output_lists], [inputs]
            opts = options_with(AllgatherOptions, timeout=timeout)
        opts = opts if opts is not None else AllgatherOptions()
        if len(inputs) != 1 or len(output_lists) != 1 or not even(inputs[0], output_lists[0], self._size):
            return self._engine("allgather", inputs[0] if inputs else None, output_lists, inputs, opts)
        inp, outs = inputs[0], output_lists[0]
        # rank after rank along the first dimension, as the engine's all_gather_into_tensor takes it
        flat = torch.empty((len(outs) * inp.shape[0], *inp.shape[1:]) if inp.dim() else (len(outs),), dtype=inp.dtype)

        def gather(c, a, q):
            out = c.all_gather(flat, inp, a, q)
            if out is None or isinstance(out, torch.Tensor):     # done: hand each rank's part out now
                scatter_into(outs, flat)
                return out
            return Then(out, lambda: scatter_into(outs, flat))

        return self._run("all_gather", gather, (flat, inp), flat.numel() * flat.element_size(), outs, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """Each pair's all-gather, in order (Gloo has no coalesced form of it)."""
        return Joined([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def broadcast(self, tensors, opts=None, root=None, timeout=None):
        if type(opts) is not BroadcastOptions:         # broadcast(tensor, root)
            tensors = [tensors] if isinstance(tensors, torch.Tensor) else tensors
            opts = options_with(BroadcastOptions, rootRank=opts if opts is not None else root, timeout=timeout)
        root = opts.rootRank               # a bad root rank or root tensor: Gloo's own refusal, at once
        if len(tensors) != 1 or not plain(tensors[0]) or not 0 <= root < self._size or opts.rootTensor != 0 \
                or self._size == 1:
            return self._engine("broadcast", tensors[0] if tensors else None, tensors, opts)
        t = tensors[0]
        return self._run("broadcast", lambda c, a, q: c.broadcast(t, root, a, q), tensors,
                         t.numel() * t.element_size(), tensors, opts)

    def barrier(self, opts=None, timeout=None):
        opts = opts if opts is not None else options_with(dist.BarrierOptions, timeout=timeout)
        if self._size == 1:
            return self._engine("barrier", None, opts)
        return self._run("barrier", lambda c, a, q: c.barrier(a, False), (), 0, None, opts)

    # --- collectives the engine runs, every form of them as torch's bindings take it ----------

    def allreduce_coalesced(self, *args, **kwargs):
        return self._engine("allreduce_coalesced", first_tensor(args, kwargs), *args, **kwargs)

    def all_to_all_single(self, *args, **kwargs):
        return self._engine("alltoall_base", first_tensor(args, kwargs), *args, **kwargs)

    alltoall_base = all_to_all_single

    def alltoall(self, *args, **kwargs):
        return self._engine("alltoall", first_tensor(args, kwargs), *args, **kwargs)

    def gather(self, *args, **kwargs):
        return self._engine("gather", first_tensor(args, kwargs), *args, **kwargs)

    def scatter(self, *args, **kwargs):
        return self._engine("scatter", first_tensor(args, kwargs), *args, **kwargs)

    def reduce(self, *args, **kwargs):
        return self._engine("reduce", first_tensor(args, kwargs), *args, **kwargs)

    def send(self, tensors, dst: int, tag: int = 0):
        return self.engine(tensors[0].device).send(tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self.engine(tensors[0].device).recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self.engine(tensors[0].device).recv_anysource(tensors, tag)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Gloo's monitored barrier, on the engine: every rank reports to rank 0, which names
        the ranks that did not (``dist.monitored_barrier`` itself refuses any backend but Gloo:
        call this method on the group)."""
        timeout = timeout if timeout is not None else datetime.timedelta(seconds=self.timeout)
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
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abandon(f"the gradsync process group was {'aborted' if how == 'abort' else 'shut down'}")
        for engine in self.engines.values():
            end = getattr(engine, how, None) or getattr(engine, "abort", None)
            if end is not None:
                try:
                    end()
                except RuntimeError:          # an engine that cannot abort (Gloo before 2.6): its
                    pass                      # sockets close when it is freed
        if comm is not None:
            comm.close()
        from ..runtime.state import STATE

        try:                                 # what else the runtime kept for the group (its host map)
            STATE.forget(comm.key if comm is not None else group_key(self))
        except (RuntimeError, ValueError):   # torch has unregistered it already: nothing was kept
            pass


def create(opts, backend_options=None) -> GradsyncGroup:
    """The creator torch.distributed calls (``extended_api=True``): ``opts`` carries the
    group's store, rank, size and timeout. The algorithm choices are read here, so a bad
    GRADSYNC_ALGORITHMS fails ``init_process_group`` with a ConfigError naming it.

    Example: ``dist.Backend.register_backend("gradsync", create, extended_api=True, devices=["cpu"])``.
    """
    return GradsyncGroup(opts.store, opts.group_rank, opts.group_size, subgroup_timeout(opts.timeout))
