"""The trace of a simulated collective, laid out as a measured one (the layout is in
``gradsync.tools.trace_files``): a slice per collective, round and transfer event of each
node as the simulator timed them, and a counter track per busy link.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ...errors import ConfigError
from ...core.schedule import COPY
from ...core.trace_events import complete, document, metadata

STEPS_LIMIT = 250_000      # (node, round) pairs of a simulated trace: a ring of 256 workers has 130 560


def check_size(schedule) -> np.ndarray:
    """The (node, round) steps of a schedule's trace, as node * rounds + round; ConfigError
    beyond ``STEPS_LIMIT`` (check before simulating: ``check_size(ring.schedule(4, 8))``)."""
    t, c, rounds = schedule.transfers, schedule.compute, max(schedule.rounds, 1)
    steps = np.unique(np.concatenate([t["src"].astype(np.int64) * rounds + t["round"],
                                      t["dst"].astype(np.int64) * rounds + t["round"],
                                      c["node"].astype(np.int64) * rounds + c["round"]]))
    if len(steps) > STEPS_LIMIT:
        raise ConfigError(f"a trace of {schedule.algorithm} on {schedule.workers} workers has {len(steps)} "
                          f"(worker, round) steps, more than {STEPS_LIMIT}: its file would take gigabytes; "
                          f"trace fewer workers")
    return steps


def from_simulation(result, sequence: int = 0) -> dict:
    """The trace of a simulated collective (a ``SimResult``), laid out as a measured one.

    Node n's round r runs from the end of its previous round (when it posts the round) until
    its transfers of the round are delivered and their reduction is done, as the simulator
    times it: ``send`` at the start (posting is free in the model), ``recv wait`` until the
    last receive is delivered, ``send wait`` until the last send is, ``reduce`` for the adds.
    ConfigError beyond ``STEPS_LIMIT`` (node, round) pairs: the file would take gigabytes.
    """
    s = result.schedule
    steps = _steps_of(result)
    events = []
    for node in range(s.nodes):
        label = f"rank {node}" if node < s.workers else f"{s.helpers[node - s.workers]} (helper)"
        events += metadata(node, label) + metadata(node, "collective", tid=0)
    now, inner = 0.0, []              # the end of the node's latest round, and its slices so far
    for k in range(len(steps.node)):
        if k and steps.node[k] != steps.node[k - 1]:
            events += [_collective_slice(result, int(steps.node[k - 1]), now, sequence), *inner]
            now, inner = 0.0, []
        now, slices = _round_slices(result, steps, k, now)
        inner += slices
    if len(steps.node):
        events += [_collective_slice(result, int(steps.node[-1]), now, sequence), *inner]
    events += _link_counters(result, s.nodes)
    return document(events, "simulated", algorithm=s.algorithm, bytes=s.elements * result.itemsize,
                    workers=s.workers, topology=result.topology.name, time_s=result.time)


class _Steps(NamedTuple):
    """The (node, round) steps of a simulated trace, as ``check_size`` lists them."""

    node: np.ndarray
    round: np.ndarray
    received: np.ndarray          # when its last receive was delivered (-inf: it has none)
    sent: np.ndarray              # when its last send was
    adds: np.ndarray              # elements added in
    madds: np.ndarray             # multiply-adds of its compute
    work: np.ndarray              # seconds of both, at the node's rates
    incoming: list                # per step: its transfers in
    outgoing: list                # and out


def _steps_of(result) -> _Steps:
    """Per step of ``result``'s schedule: its transfers and when they were delivered, and its work."""
    s, topo = result.schedule, result.topology
    t, c = s.transfers, s.compute
    rounds = max(s.rounds, 1)
    names = [topo.nodes[p].name for p in result.placement]
    add_rate = np.array([topo.reduce_rate(n) or np.inf for n in names])
    madd_rate = np.array([topo.madd_rate(n) or np.inf for n in names])
    steps = check_size(s)
    src_key = t["src"].astype(np.int64) * rounds + t["round"]
    dst_key = t["dst"].astype(np.int64) * rounds + t["round"]
    out_step, in_step = np.searchsorted(steps, src_key), np.searchsorted(steps, dst_key)
    received = np.full(len(steps), -np.inf)
    np.maximum.at(received, in_step, result.done)
    sent = np.full(len(steps), -np.inf)
    np.maximum.at(sent, out_step, result.done)
    adds = np.bincount(in_step, weights=np.where(t["op"] != COPY, t["count"], 0), minlength=len(steps))
    madds = np.bincount(np.searchsorted(steps, c["node"].astype(np.int64) * rounds + c["round"]),
                        weights=c["madds"], minlength=len(steps))
    node_of, round_of = steps // rounds, steps % rounds
    work = adds / add_rate[node_of] + madds / madd_rate[node_of]
    outgoing = np.split(np.argsort(out_step, kind="stable"), np.searchsorted(np.sort(out_step), np.arange(1, len(steps))))
    incoming = np.split(np.argsort(in_step, kind="stable"), np.searchsorted(np.sort(in_step), np.arange(1, len(steps))))
    return _Steps(node_of, round_of, received, sent, adds, madds, work, incoming, outgoing)


def _collective_slice(result, node: int, end: float, sequence: int) -> dict:
    """Node ``node``'s collective slice, from 0 to ``end`` seconds."""
    s = result.schedule
    return complete(f"all_reduce {s.algorithm}", "collective", node, 0.0, end * 1e6,
                    {"sequence": sequence, "algorithm": s.algorithm, "bytes": s.elements * result.itemsize,
                     "workers": s.workers, "rounds": s.rounds})


def _round_slices(result, steps: _Steps, k: int, start: float) -> tuple[float, list[dict]]:
    """Step k's round, posted at ``start``: when it ends, and its slice followed by its transfer
    events' (send, recv wait, send wait, reduce or compute)."""
    t, itemsize = result.schedule.transfers, result.itemsize
    node, r, ins = int(steps.node[k]), int(steps.round[k]), steps.incoming[k]
    got = max(float(steps.received[k]), start)
    done = max(got, float(steps.sent[k]))
    parts = [complete("send", "transfer", node, start * 1e6, 0.0,
                      _args(t, i, int(t["dst"][i]), itemsize) | {"start_s": float(result.start[i]),
                                                                  "sent_s": float(result.sent[i]),
                                                                  "done_s": float(result.done[i])})
             for i in steps.outgoing[k].tolist()]
    if len(ins):
        parts.append(complete("recv wait", "transfer", node, start * 1e6, (got - start) * 1e6,
                              _merged_args(t, ins, t["src"], itemsize)))
    if done > got:
        parts.append(complete("send wait", "transfer", node, got * 1e6, (done - got) * 1e6, {"round": r}))
    adds, madds, work = steps.adds[k], steps.madds[k], steps.work[k]
    if adds or madds:
        reduced = ins[t["op"][ins] != COPY]
        args = _merged_args(t, reduced, t["src"], itemsize) if adds else {"round": r}
        parts.append(complete("reduce" if adds else "compute", "transfer", node, done * 1e6, work * 1e6,
                              args | {"madds": int(madds)}))
    end = done + float(work)
    return end, [complete(f"round {r}", "round", node, start * 1e6, (end - start) * 1e6, {"round": r})] + parts


def _args(t, i, peer, itemsize) -> dict:
    return {"round": int(t["round"][i]), "peer": peer, "bytes": int(t["count"][i]) * itemsize}


def _merged_args(t, ids, peers_of, itemsize) -> dict:
    """Args of a slice that stands for several transfers: bytes in all, and per peer."""
    if len(ids) == 1:
        return _args(t, int(ids[0]), int(peers_of[ids[0]]), itemsize)
    per_peer: dict[int, int] = defaultdict(int)
    for i in ids.tolist():
        per_peer[int(peers_of[i])] += int(t["count"][i]) * itemsize
    return {"round": int(t["round"][ids[0]]) if len(ids) else -1, "bytes": sum(per_peer.values()),
            "peers": {str(p): b for p, b in sorted(per_peer.items())}}


def _link_counters(result, pid: int) -> list[dict]:
    """A counter track per busy directed link: the utilisation of its capacity, from each flow's
    mean rate (its bytes over the time they took to leave) while it was on the link: at every
    start and end of a flow on the link, the sum of the rates of the flows on it."""
    s, topo = result.schedule, result.topology
    t = s.transfers
    busy = np.flatnonzero(result.channel_bytes)
    if not len(busy):
        return []
    nbytes = t["count"].astype(float) * result.itemsize
    duration = result.sent - result.start
    rate = np.divide(nbytes, duration, out=np.zeros_like(nbytes), where=duration > 0)
    names = [topo.nodes[p].name for p in result.placement]
    pair = t["src"].astype(np.int64) * s.nodes + t["dst"]
    unique, inverse = np.unique(pair, return_inverse=True)
    flows, channels = [], []           # (transfer, channel) for every hop of every transfer
    for u, p in enumerate(unique.tolist()):
        hops = topo.route(names[p // s.nodes], names[p % s.nodes])[0]
        members = np.flatnonzero(inverse == u)
        for ch in hops:
            flows.append(members)
            channels.append(np.full(len(members), ch))
    flow, channel = np.concatenate(flows), np.concatenate(channels)
    events = metadata(pid, "links")
    for ch in busy.tolist():
        on = flow[channel == ch]
        times = np.concatenate([result.start[on], result.sent[on]])
        change = np.concatenate([rate[on], -rate[on]])
        order = np.lexsort((change, times))           # at one instant, ends before starts
        level = np.cumsum(change[order])
        at, last = np.unique(times), None
        ends = np.searchsorted(times[order], at, side="right") - 1   # the level after every change at that time
        capacity = topo.channel_capacity[ch]
        name = result.channel_name(ch)
        for a, value in zip(at.tolist(), level[ends].tolist()):
            u = round(float(min(1.0, max(0.0, value / capacity))), 6) if capacity > 0 else 0.0
            if u != last:
                events.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": a * 1e6,
                               "args": {"utilisation": u}})
                last = u
    return events
