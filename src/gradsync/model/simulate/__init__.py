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

import numpy as np

from ...errors import ConfigError
from ...core.schedule import Schedule
from ..topology import Topology
from .engine import _run
from .flows import _full
from .network import _Net, _placement
from .result import TIME_COLUMNS, TIMELINE_FORMAT, SimResult, load_timeline
from .symmetry import _cyclic, _quotient

__all__ = ["SimResult", "TIMELINE_FORMAT", "TIME_COLUMNS", "load_timeline", "simulate"]


def simulate(schedule: Schedule, topology: Topology, itemsize: int = 4, symmetry: bool = True) -> SimResult:
    """Time ``schedule`` on ``topology`` with elements of ``itemsize`` bytes.

    Worker w runs on ``topology.workers[w]``; the helper 'host' on ``topology.host``. With
    ``symmetry``, a schedule that rotating the workers maps onto itself (a ring with equal
    chunks, sharded, host) on a topology that the rotation maps onto itself too (every worker
    on the same kind of link to one switch) is simulated on one worker's transfers: every
    rotated copy of a transfer would take the same arithmetic on the same numbers, so the
    times are identical to the full simulation's, bit for bit, at 1/N of the work. A schedule
    that moves nothing (one worker, or zero elements) takes no time:

    >>> from gradsync.algorithms import ring
    >>> from gradsync.model.topology import preset
    >>> simulate(ring.schedule(1, 100), preset("ethernet", 1)).time
    0.0
    """
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
        raise ConfigError(f"itemsize must be a positive integer number of bytes, got {itemsize!r}")
    placement = _placement(schedule, topology)
    net = _Net.of(topology, placement)
    n_channels = 2 * len(topology.links)
    found = _cyclic(schedule) if symmetry else None
    system = _quotient(schedule, net, itemsize, *found) if found else None
    if system is None:
        system = _full(schedule, net, itemsize)
    times, node_done, busy = _run(system)
    carried = np.bincount(system.paths.ravel(), weights=np.repeat(system.nbytes, system.paths.shape[1]),
                          minlength=len(system.capacity)) * system.weight
    carried[-1] = busy[-1] = 0.0                          # the padding channel
    node_done = node_done[system.node_of]
    return SimResult(schedule, topology, itemsize, float(node_done.max(initial=0.0)), node_done,
                     carried[system.channel_of][:n_channels], busy[system.channel_of][:n_channels], placement,
                     times, system.flow_round, system.orbit)
