"""The schedule as the event loop's system: its transfers as flows along their routes, and the
(node, round) steps that send and receive them with each step's work. ``_full`` makes every
transfer a flow; the symmetric shortcut (``symmetry``) builds a smaller system with the same
``_steps``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...core.schedule import COPY
from .engine import _System
from .network import _pair_routes


def _full(schedule, net, itemsize) -> _System:
    """Every transfer a flow."""
    t, c, nodes = schedule.transfers, schedule.compute, schedule.nodes
    pair = t["src"].astype(np.int64) * nodes + t["dst"]
    unique, inverse = _dense_unique(pair, nodes * nodes)
    paths, latency = _pair_routes(unique // nodes, unique % nodes, net)
    adds = np.where(t["op"] != COPY, t["count"], 0)
    costs = _NodeCosts(np.ones(nodes), net.add_rate, net.madd_rate, net.overhead, net.per_round, net.machine,
                       net.cores, np.ones(nodes))
    lanes = None if schedule.lane is None else (schedule.lane, schedule.lane, int(schedule.lane.max(initial=0)) + 1)
    steps = _steps((t["src"], t["dst"], t["round"]), (c["node"], c["round"], c["madds"]), adds,
                   max(schedule.rounds, 1), costs, lanes)
    inverse = inverse.reshape(-1)
    deps = _data_deps(t, steps[0], steps[1], steps[4]) if lanes is not None and lanes[2] > 1 else None
    return _System(paths[inverse], net.capacity, net.fan_in, net.node_channel[t["dst"]], latency[inverse],
                   net.wire_bytes(t["src"], t["dst"], t["count"], itemsize), np.ones(len(net.capacity)), *steps[:4],
                   nodes, net.startup, t["round"], np.arange(nodes), np.arange(len(net.capacity)), None, net.eager,
                   steps[4], deps)


def _data_deps(t, step_src, step_dst, step_track):
    """Where a transfer sends on data that reached its sender in another track (lane): the step
    that sends it and the flow it must wait for, the latest one of an earlier round into the
    sender with the same segment. Tracks keep their own rounds apart; this keeps the data's
    order across them (NCCL's tree root turns each reduced segment into the broadcast). Only
    exact segments are matched: the schedules with lanes move whole segments."""
    n = len(t)
    node = np.concatenate([t["dst"], t["src"]]).astype(np.int64)
    key = np.stack([np.repeat([1, 0], n), np.concatenate([t["round"], t["round"]]),
                    np.concatenate([t["count"], t["count"]]), np.concatenate([t["offset"], t["offset"]]), node])
    order = np.lexsort(key)                      # by node, segment, then round, sends before arrivals
    arrival = order < n
    same = np.ones(len(order), bool)
    same[:1] = False                             # the first entry starts a group
    for row in (node, key[3], key[2]):           # the same node and segment
        same[1:] &= row[order][1:] == row[order][:-1]
    group = np.cumsum(~same)
    last = np.where(arrival, np.arange(len(order)), -1)
    last = np.maximum.accumulate(last)           # the latest arrival at or before each position
    first_of_group = np.flatnonzero(~same)[group - 1] if len(order) else order
    sends = ~arrival & (last >= first_of_group) & (last >= 0)
    flow, before = order[sends] - n, order[last[sends]]
    other = step_track[step_src[flow]] != step_track[step_dst[before]]
    return step_src[flow[other]], before[other]


class _NodeCosts(NamedTuple):
    """Per system node, what its steps' work costs (the topology's node terms, ``_Net``'s), and
    for how many schedule nodes it stands."""

    node_weight: np.ndarray     # adds and messages of one step count this many times
    add_rate: np.ndarray
    madd_rate: np.ndarray
    overhead: np.ndarray        # per message sent or received
    per_round: np.ndarray
    machine: np.ndarray         # the machine whose cores it shares, or -1
    cores: np.ndarray           # per machine
    stands_for: np.ndarray      # schedule nodes computing at once on its machine


def _steps(flows, compute, adds, rounds: int, costs: _NodeCosts, lanes=None):
    """The (node, round) steps of a system of flows (``flows``: src, dst and round per flow;
    ``compute``: node, round and multiply-adds per local computation): each flow's sending and
    receiving step, the steps in order per node, and each step's work (its ``adds`` and
    messages, scaled by ``node_weight``, and its multiply-adds). Where nodes share a machine's
    ``cores``, a step's compute takes max(1, c / cores) times as long, c the number of nodes
    computing in that round on that machine (a system node ``stands_for`` that many) -- the
    round as a proxy for "at the same time".

    With ``lanes`` (the lane of each flow at its sender and at its receiver, and how many
    lanes), a node's lanes are separate tracks of steps (NCCL's channels run independently):
    the steps are (node, lane, round), in order per (node, lane). Returns the flows' sending and
    receiving steps, each step's node, its work, and its track (node * lanes + lane)."""
    (src, dst, rnd), (comp_node, comp_round, comp_madds) = flows, compute
    node_weight, add_rate, madd_rate, overhead, per_round, machine, cores, stands_for = costs
    n_fl = len(src)
    src_lane, dst_lane, count = lanes if lanes is not None else (0, 0, 1)
    keys = np.concatenate([(src.astype(np.int64) * count + src_lane) * rounds + rnd,
                           (dst.astype(np.int64) * count + dst_lane) * rounds + rnd,
                           comp_node.astype(np.int64) * count * rounds + comp_round])
    steps, key_step = _dense_unique(keys, len(node_weight) * count * rounds)
    step_src, step_dst = key_step[:n_fl], key_step[n_fl:2 * n_fl]
    step_track = steps // rounds
    step_node = step_track // count
    n_steps = len(steps)
    added = np.bincount(step_dst, weights=adds, minlength=n_steps) * node_weight[step_node]
    madds = np.bincount(key_step[2 * n_fl:], weights=comp_madds, minlength=n_steps)
    work_time = added / add_rate[step_node] + madds / madd_rate[step_node]
    on = (machine[step_node] >= 0) & (work_time > 0)
    if on.any():
        where = machine[step_node[on]] * rounds + steps[on] % rounds
        computing = np.bincount(where, weights=stands_for[step_node[on]], minlength=len(cores) * rounds)
        work_time[on] *= np.maximum(1.0, computing[where] / cores[machine[step_node[on]]])
    work_time = work_time + per_round[step_node]
    if overhead.any():                     # per message sent or received, one after another
        messages = np.bincount(np.concatenate([step_src, step_dst]), minlength=n_steps) * node_weight[step_node]
        work_time = work_time + messages * overhead[step_node]
    return step_src, step_dst, step_node, work_time, step_track


def _dense_unique(keys, space):
    """``np.unique(keys, return_inverse=True)`` for keys in ``range(space)``: by marking, not
    sorting, when the space is not much larger than the keys."""
    if space > 4 * len(keys) + (1 << 20):
        return np.unique(keys, return_inverse=True)
    present = np.zeros(space, bool)
    present[keys] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[keys]
