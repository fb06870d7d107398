"""Flow-level discrete-event network simulator for schedules on topologies.

Model:
- A transfer is a flow along its route. Flows crossing a directed channel share its
  bandwidth max-min fairly (progressive filling); a flow is delivered one route latency
  after its last byte leaves.
- A node's rounds are sequential: it starts round r when all of its transfers (in and out)
  of its previous round are delivered and its work for that round is done: each element it
  received to add in (REDUCE, or CODED: a packet is combined with one add) at the node's
  ``reduce_rate``, and the round's compute multiply-adds at its ``madd_rate`` (free where the
  topology sets none), plus its ``message_overhead`` per message and its ``round_overhead``.
  Its first round starts after its ``collective_overhead``. Nodes behind one machine (a node
  with ``cores``) computing in the same round share its cores. A transfer starts when both
  ends have started its round (receives are posted). There is no global barrier.

The modules, in the order a simulation uses them: ``network`` (the topology as arrays:
placement, channels, routes, max-min fair rates), ``flows`` (the schedule as the loop's
flows and steps), ``symmetry`` (the same for one worker's transfers, where a rotation maps
schedule and topology onto themselves), ``engine`` (the event loop), ``result`` (what it
measured, and the timeline on disk).

>>> from gradsync.algorithms import central
>>> from gradsync.model.topology import preset
>>> round(simulate(central.schedule(4, 40_000_000), preset("pcie-switch-4")).time, 4)
0.06
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import ConfigError
from ...core.compact import CompactSchedule
from ...core.schedule import Schedule
from ..topology import Topology
from .compact import candidate_strides, compact_system
from .engine import _run
from .flows import _full
from .network import _Net, _placement
from .result import TIME_COLUMNS, TIMELINE_FORMAT, SimResult, load_timeline
from .scalar import _run_scalar, small
from .symmetry import _cyclic, _quotient

__all__ = ["EXPAND_LIMIT", "SimResult", "TIMELINE_FORMAT", "TIME_COLUMNS", "load_timeline", "simulate"]

EXPAND_LIMIT = 1 << 16     # transfers: a compact schedule off the symmetric path is expanded up to this many
NARROW_CLASSES = 1e-2      # chunk sizes within 1%: the smallest class is bounded, not simulated


def simulate(schedule: Schedule | CompactSchedule, topology: Topology, itemsize: int = 4, symmetry: bool = True,
             expand_limit: int = EXPAND_LIMIT, progress=None, protocol: str | None = None) -> SimResult:
    """Time ``schedule`` on ``topology`` with elements of ``itemsize`` bytes.

    Worker w runs on ``topology.workers[w]``; the helper 'host' on ``topology.host``. With
    ``symmetry``, a schedule that rotating the workers maps onto itself (a ring with equal
    chunks, sharded, host) on a topology that the rotation maps onto itself too (every worker
    on the same kind of link to one switch) is simulated on one worker's transfers: every
    rotated copy of a transfer would take the same arithmetic on the same numbers, so the
    times are identical to the full simulation's, bit for bit, at 1/N of the work.

    A ``CompactSchedule`` is read without its table: one block of workers under the largest
    subgroup of its rotations the topology keeps (every worker, or every machine), bit for
    bit the expanded schedule's times. Unequal chunks (a size N does not divide) are expanded
    up to ``expand_limit`` transfers; beyond, the result is the time with every chunk at its
    class's largest size, ``classes`` holding the times with every chunk at its smallest and
    at its largest. Where no two transfers share a channel the exact time lies between them;
    on oversubscribed links unequal chunks spread the workers' use of the shared uplinks, and
    the exact time was up to 1.7% below the smaller (N <= 256, docs/simulator.md).

    On a GPU topology (``topology.gpu``) the transfers move by one of NCCL's protocols
    (``protocol``: "ll", "ll128" or "simple"; None: the topology's default): its wire bytes,
    its latency per step and per collective, and posted sends (see ``topology.gpu``). Elsewhere
    ``protocol`` must be None. ``progress(stage, value)``, if given, hears ``("flows", count)``
    (a compact block) or ``("transfers", count)`` (a table) before each event loop and ``("delivered", fraction)`` during it. A schedule that moves
    nothing takes no time:

    >>> from gradsync.algorithms import ring
    >>> from gradsync.model.topology import preset
    >>> simulate(ring.schedule(1, 100), preset("ethernet", 1)).time
    0.0
    """
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
        raise ConfigError(f"itemsize must be a positive integer number of bytes, got {itemsize!r}")
    chosen = _protocol(topology, protocol)
    if isinstance(schedule, CompactSchedule):
        return _simulate_compact(schedule, topology, itemsize, symmetry, expand_limit, progress, chosen)
    placement = _placement(schedule, topology)
    net = _Net.of(topology, placement, chosen)
    found = _cyclic(schedule) if symmetry else None
    system = _quotient(schedule, net, itemsize, *found) if found else None
    if system is None:
        system = _full(schedule, net, itemsize)
    return _result(schedule, topology, itemsize, placement, system, progress=progress, protocol=chosen)


def _protocol(topology: Topology, protocol: str | None):
    """The ``gpu.Protocol`` a simulation on ``topology`` uses, or None (a topology of hosts)."""
    if topology.gpu is None:
        if protocol is not None:
            raise ConfigError(f"protocol {protocol!r}: topology {topology.name!r} is not a GPU machine "
                              "(it models links alone); leave the protocol out")
        return None
    return topology.gpu.protocol(protocol)


def _result(schedule, topology, itemsize, placement, system, strides=None, progress=None, protocol=None) -> SimResult:
    if progress is not None:          # one block's flows run one by one; a table's, many at each event
        progress("flows" if strides is not None else "transfers", len(system.paths))
    loop = _run_scalar if small(system) else _run          # the same times, bit for bit
    times, node_done, busy = loop(system, None if progress is None else lambda f: progress("delivered", f))
    n_channels = 2 * len(topology.links)
    carried = np.bincount(system.paths.ravel(), weights=np.repeat(system.nbytes, system.paths.shape[1]),
                          minlength=len(system.capacity)) * system.weight
    carried[-1] = busy[-1] = 0.0                          # the padding channel
    node_done = node_done[system.node_of]
    return SimResult(schedule, topology, itemsize, float(node_done.max(initial=0.0)), node_done,
                     carried[system.channel_of][:n_channels], busy[system.channel_of][:n_channels], placement,
                     times, system.flow_round, system.orbit, strides=strides,
                     protocol=None if protocol is None else protocol.name)


def _simulate_compact(c, topology, itemsize, symmetry, expand_limit, progress, protocol) -> SimResult:
    """The compact path: one block under a subgroup, else the expansion, else the size classes."""
    placement = _placement(c, topology)
    net = _Net.of(topology, placement, protocol)
    exact = _symmetric(c, topology, net, placement, itemsize, progress) if symmetry and c.equal_chunks else None
    if exact is not None:
        return exact
    if not symmetry or c.transfer_count <= expand_limit:
        return simulate(c.expand(), topology, itemsize, symmetry, progress=progress,
                        protocol=None if protocol is None else protocol.name)
    spread = max(((hi - lo) / hi for lo, hi in c.level_sizes() if hi), default=0.0)
    kinds = ("high",) if spread < NARROW_CLASSES else ("low", "high")
    found = [_symmetric(c.with_counts(k), topology, net, placement, itemsize, progress) for k in kinds]
    if any(r is None for r in found):
        raise ConfigError(f"{c.algorithm} on {c.workers} workers: the topology {topology.name!r} breaks the "
                          f"schedule's symmetry, and its {c.transfer_count:,} transfers are more than "
                          f"{expand_limit:,} to simulate one by one")
    high = found[-1]
    # chunks within 1% of each other: the smallest class is not simulated; every byte's time
    # shrinks at most in proportion, latencies stay, so its time is at least the largest's x (1 - spread)
    low = found[0].time if len(found) == 2 else high.time * (1 - spread)
    return replace(high, schedule=c, classes=(low, high.time))


def _symmetric(c, topology, net, placement, itemsize, progress=None):
    """The compact schedule simulated on one block, under the first subgroup the topology keeps
    (the machines' size is looked up only when every rotation is not kept)."""
    tried = set()
    for lookup in (False, True):
        machine = topology.machine_size(c.workers) if lookup else 0
        for strides in candidate_strides(c, machine):
            if strides in tried:
                continue
            tried.add(strides)
            system = compact_system(c, net, itemsize, strides)
            if system is not None:
                return _result(c, topology, itemsize, placement, system, strides, progress, net.protocol)
    return None
