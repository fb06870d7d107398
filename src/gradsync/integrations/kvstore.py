"""A key-value store with push/pull semantics, built on any exact gradsync schedule.

``push`` sums what every worker pushes for a key; the sum is formed where the strategy
places it (one primary worker, the host, or each worker's shard) and, with an ``updater``,
is applied there to the stored value (D2L's "key-value store with redefined update
semantics"). ``pull`` returns the stored value to every worker. Underneath, push runs only
the schedule's REDUCE transfers and pull only its COPY transfers: the owners of each segment
are the nodes holding the complete sum after the REDUCE transfers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import algorithms
from ..errors import ConfigError
from ..core.schedule import COPY, REDUCE, Schedule, complete_segments
from ..runtime.agree import agree
from ..runtime import flight
from ..runtime.compile import compiled
from ..runtime.request import default_timeout
from ..runtime.collective import Collective, node_buffers
from ..runtime.transport import DistributedTransport


@dataclass
class _Entry:
    schedule: Schedule
    buffers: dict            # node -> flat tensor: the stored value lives in the owned segments
    shape: torch.Size
    owned: dict              # node -> segments it holds the complete sum of after a push


class KVStore:
    """Push/pull key-value store over a process group (every rank makes the same calls).

    Args:
        strategy: where aggregates are formed: "central" (worker 0), "host" (the host CPU,
            in rank 0's process), "sharded" (each key split across all workers), or "ring",
            "tree", "halving_doubling" (their reduce phases decide the owners).
        updater: ``updater(key, aggregate, stored)`` applied in place on the owners' segments
            after each push, e.g. an SGD step; without one, push stores the sum.

    Example, in each of N processes::

        kv = KVStore("sharded", updater=lambda key, grad, weight: weight.sub_(0.1 * grad))
        kv.init("w", torch.zeros(10))
        kv.push("w", grad)          # sums every worker's grad, updates the owners' shards
        kv.pull("w", out=weight)    # every worker gets the updated weight
    """

    def __init__(self, strategy: str = "sharded", updater=None, group=None, timeout: float | None = None):
        if strategy not in algorithms.names(exact=True):
            raise ConfigError(f"strategy must be an exact algorithm, one of {', '.join(algorithms.names(exact=True))}, "
                              f"got {strategy!r}")
        self.strategy, self.updater, self.group = strategy, updater, group
        self.timeout = default_timeout() if timeout is None else float(timeout)
        flight.watch_signal()
        self.transport = DistributedTransport(group)
        self._entries: dict = {}

    def _deadline(self):
        return time.monotonic() + self.timeout

    def init(self, key, value: torch.Tensor) -> None:
        """Store the initial ``value`` of ``key`` (the same on every rank)."""
        if key in self._entries:
            raise ConfigError(f"key {key!r} is already initialized")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ConfigError(f"value of key {key!r} must be a float tensor")
        agree(self.transport, {"kv": "init", "key": str(key), "shape": list(value.shape),
                                "dtype": str(value.dtype), "strategy": self.strategy}, self._deadline())
        schedule = algorithms.build(self.strategy, self.transport.size, value.numel())
        buffers = node_buffers(schedule, self.transport.rank, value.detach().reshape(-1).clone())
        for node, buf in buffers.items():
            buf.copy_(value.reshape(-1))
        self._entries[key] = _Entry(schedule, buffers, value.shape, complete_segments(schedule))

    def _entry(self, key, tensor: torch.Tensor) -> _Entry:
        if key not in self._entries:
            raise ConfigError(f"key {key!r} was never initialized: call init first")
        entry = self._entries[key]
        if tensor.shape != entry.shape:
            raise ConfigError(f"key {key!r} holds shape {tuple(entry.shape)}, got {tuple(tensor.shape)}")
        return entry

    def push(self, key, value) -> None:
        """Sum ``value`` (a tensor, or a list of tensors summed locally first) over all workers
        into ``key``'s owners, applying the updater there."""
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise ConfigError(f"push of key {key!r} got an empty list")
        entry = self._entry(key, values[0])
        total = values[0].detach().reshape(-1).to(entry.buffers[self.transport.rank].dtype).clone()
        for v in values[1:]:
            self._entry(key, v)
            total += v.detach().reshape(-1)
        deadline = self._deadline()
        agree(self.transport, {"kv": "push", "key": str(key), "shape": list(entry.shape)}, deadline)
        work = {node: (total if node == self.transport.rank else torch.zeros_like(total)) for node in entry.buffers}
        self._run(entry, work, deadline, REDUCE)
        for node, segments in entry.owned.items():
            if node not in entry.buffers:
                continue
            for offset, count in segments:
                stored = entry.buffers[node][offset:offset + count]
                aggregate = work[node][offset:offset + count]
                if self.updater is None:
                    stored.copy_(aggregate)
                else:
                    self.updater(key, aggregate, stored)

    def pull(self, key, out: torch.Tensor) -> torch.Tensor:
        """Copy ``key``'s stored value into ``out`` on every worker."""
        entry = self._entry(key, out)
        deadline = self._deadline()
        agree(self.transport, {"kv": "pull", "key": str(key), "shape": list(entry.shape)}, deadline)
        view = {node: buf.clone() for node, buf in entry.buffers.items()}
        self._run(entry, view, deadline, COPY)
        out.copy_(view[self.transport.rank].view(entry.shape))
        return out

    def _run(self, entry: _Entry, buffers: dict, deadline: float, op: int) -> None:
        """Run only the schedule's ``op`` transfers (REDUCE for push, COPY for pull) on ``buffers``."""
        dtype = str(buffers[self.transport.rank].dtype).removeprefix("torch.")
        plan = compiled(self.strategy, self.transport.size, entry.schedule.elements, dtype, "{}",
                        self.transport.rank, (op,)).plan
        Collective(entry.schedule, plan, buffers, self.transport, deadline).start(inline=True).wait()

    def pushpull(self, key, value, out: torch.Tensor) -> torch.Tensor:
        """Push then pull: the common training step."""
        self.push(key, value)
        return self.pull(key, out)
