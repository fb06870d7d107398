"""Chrome trace files (the JSON trace event format ui.perfetto.dev and chrome://tracing open) of
measured and simulated collectives, laid out alike so that the two open side by side.

Layout, the same for a measured run (``gradsync.runtime.tracing``) and a simulated one
(``from_simulation``):

- one process (``pid``) per rank, named "rank r", with one thread (``tid`` 0);
- on it a slice per collective ("all_reduce ring", category ``collective``), inside it a slice
  per round ("round r", category ``round``, args ``round``), and inside those a slice per
  transfer event (category ``transfer``): ``send`` (posting a send), ``recv wait`` (waiting
  for a receive to arrive), ``send wait`` (waiting for sends to complete), ``reduce`` (adding
  a received piece in), each with ``bytes``, ``peer`` and ``round`` as args;
- simulated runs add a process "links" with a counter track per busy link: its utilisation
  (0 to 1) over time.

Times are microseconds ("X" complete events: ``ts`` and ``dur``); "M" metadata events name the
processes and threads; "C" events are counters. ``validate`` checks a file against this and
against the format's rule that slices of one thread nest. ``structure`` reduces a trace to what
does not depend on timing (per rank and round: bytes per transfer kind and peer), so a measured
and a simulated trace of one schedule compare equal; ``compare`` sets their rounds' times side
by side.

>>> from gradsync.algorithms import ring
>>> from gradsync.model.simulate import simulate
>>> from gradsync.model.topology import preset
>>> t = from_simulation(simulate(ring.schedule(4, 1000), preset("ethernet", 4)))
>>> validate(t); len(structure(t)[0])
6
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import numpy as np

from ..errors import ConfigError
from ..core.schedule import COPY
from ..core.trace_events import (METADATA, STRUCTURAL, TRANSFER_KINDS, complete, document, metadata,
                                  round_slices)

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
    s, topo = result.schedule, result.topology
    t, c = s.transfers, s.compute
    itemsize, rounds = result.itemsize, max(s.rounds, 1)
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

    events = []
    for node in range(s.nodes):
        label = f"rank {node}" if node < s.workers else f"{s.helpers[node - s.workers]} (helper)"
        events += metadata(node, label) + metadata(node, "collective", tid=0)
    nbytes = s.elements * itemsize
    now, inner = 0.0, []

    def close(node, end):
        events.append(complete(f"all_reduce {s.algorithm}", "collective", node, 0.0, end * 1e6,
                               {"sequence": sequence, "algorithm": s.algorithm, "bytes": nbytes,
                                "workers": s.workers, "rounds": s.rounds}))
        events.extend(inner)

    for k in range(len(steps)):
        node, r = int(node_of[k]), int(round_of[k])
        if k and node != node_of[k - 1]:
            close(int(node_of[k - 1]), now)
            now, inner = 0.0, []
        start, ins, outs = now, incoming[k], outgoing[k]
        got = max(float(received[k]), start)
        done = max(got, float(sent[k]))
        parts = [complete("send", "transfer", node, start * 1e6, 0.0,
                          _args(t, i, int(t["dst"][i]), itemsize) | {"start_s": float(result.start[i]),
                                                                      "sent_s": float(result.sent[i]),
                                                                      "done_s": float(result.done[i])})
                 for i in outs.tolist()]
        if len(ins):
            parts.append(complete("recv wait", "transfer", node, start * 1e6, (got - start) * 1e6,
                                  _merged_args(t, ins, t["src"], itemsize)))
        if done > got:
            parts.append(complete("send wait", "transfer", node, got * 1e6, (done - got) * 1e6, {"round": r}))
        if adds[k] or madds[k]:
            reduced = ins[t["op"][ins] != COPY]
            args = _merged_args(t, reduced, t["src"], itemsize) if adds[k] else {"round": r}
            parts.append(complete("reduce" if adds[k] else "compute", "transfer", node, done * 1e6, work[k] * 1e6,
                                  args | {"madds": int(madds[k])}))
        now = done + float(work[k])
        inner.append(complete(f"round {r}", "round", node, start * 1e6, (now - start) * 1e6, {"round": r}))
        inner += parts
    if len(steps):
        close(int(node_of[-1]), now)
    events += _link_counters(result, s.nodes)
    return document(events, "simulated", algorithm=s.algorithm, bytes=nbytes, workers=s.workers,
                    topology=topo.name, time_s=result.time)


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


# --- reading traces ---------------------------------------------------------------------------

def validate(trace) -> None:
    """Check a trace against the trace event format as gradsync writes it; raise ConfigError
    naming the first bad event. The checks: a ``traceEvents`` list; every event a known phase
    (X, M, C) with an integer pid and tid and a string name; X events with ``ts`` and ``dur``
    numbers >= 0; M events one of the known metadata names with ``args.name`` or
    ``args.sort_index``; C events with numeric args; and on each thread, slices that nest (a
    slice that starts inside another ends inside it).

    >>> validate({"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0, "dur": 1}]})
    """
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ConfigError("not a trace: expected a JSON object with a 'traceEvents' list")
    threads = defaultdict(list)
    for k, e in enumerate(trace["traceEvents"]):
        def bad(why, e=e, k=k):
            raise ConfigError(f"trace event {k} ({json.dumps(e)[:120]}): {why}")
        if not isinstance(e, dict):
            bad("expected an object")
        if e.get("ph") not in ("X", "M", "C"):
            bad(f"phase must be X, M or C, got {e.get('ph')!r}")
        if not isinstance(e.get("name"), str):
            bad("name must be a string")
        for key in ("pid", "tid"):
            if isinstance(e.get(key), bool) or not isinstance(e.get(key), int):
                bad(f"{key} must be an integer")
        if e["ph"] == "M":
            args = e.get("args")
            if e["name"] not in METADATA or not isinstance(args, dict) or not ("name" in args or "sort_index" in args):
                bad(f"metadata must be one of {', '.join(METADATA)} with args.name or args.sort_index")
            continue
        if not _number(e.get("ts")) or e["ts"] < 0:
            bad("ts must be a number >= 0 (microseconds)")
        if e["ph"] == "C":
            if not isinstance(e.get("args"), dict) or not all(_number(v) for v in e["args"].values()):
                bad("a counter needs numeric args")
            continue
        if not _number(e.get("dur")) or e["dur"] < 0:
            bad("dur must be a number >= 0 (microseconds)")
        if "args" in e and not isinstance(e["args"], dict):
            bad("args must be an object")
        threads[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], k))
    for (pid, tid), slices in threads.items():
        open_ends: list[tuple[float, int]] = []
        for ts, neg_dur, k in sorted(slices):
            end = ts - neg_dur
            while open_ends and open_ends[-1][0] <= ts + 1e-6:
                open_ends.pop()
            if open_ends and end > open_ends[-1][0] + 1e-3:
                raise ConfigError(f"trace event {k}: on pid {pid} tid {tid} it starts inside event "
                                  f"{open_ends[-1][1]} and ends after it: slices of one thread must nest")
            open_ends.append((end, k))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def load(path) -> dict:
    """Read and validate a trace file; ConfigError naming the file if it is not one."""
    try:
        with open(path) as fh:
            trace = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read trace {str(path)!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"trace {str(path)!r} is not JSON: {exc}") from None
    try:
        validate(trace)
    except ConfigError as exc:
        raise ConfigError(f"trace {str(path)!r}: {exc}") from None
    return trace


def collectives(trace: dict) -> list[dict]:
    """Every collective slice with its rounds and transfer events, by rank and start time:
    ``[{"pid", "args", "ts", "dur", "rounds": [round slices], "events": [transfer slices]}]``."""
    by_thread = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append(e)
    out = []
    for (pid, _), events in sorted(by_thread.items()):
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        current = None
        for e in events:
            if e.get("cat") == "collective":
                current = {"pid": pid, "args": e.get("args", {}), "ts": e["ts"], "dur": e["dur"],
                           "rounds": [], "events": []}
                out.append(current)
            elif current is not None and e["ts"] <= current["ts"] + current["dur"] + 1e-6:
                if e.get("cat") == "round":
                    current["rounds"].append(e)
                elif e.get("cat") == "transfer":
                    current["events"].append(e)
    return out


def structure(trace: dict, which: int = 0) -> dict:
    """What a trace's ``which``-th collective of each rank moves, without its timing:
    rank -> [(round, ((kind, peer, bytes), ...)), ...] in round order, bytes summed per kind
    and peer (so a transfer cut into pieces counts once). Kinds: send, recv wait, reduce."""
    by_rank = defaultdict(list)
    for c in collectives(trace):
        by_rank[c["pid"]].append(c)
    out = {}
    for pid, cs in sorted(by_rank.items()):
        if which >= len(cs):
            continue
        sums: dict = defaultdict(lambda: defaultdict(int))
        for e in cs[which]["events"]:
            if e["name"] not in STRUCTURAL:
                continue
            args = e.get("args", {})
            peers = args.get("peers") or {str(args.get("peer")): args.get("bytes", 0)}
            for peer, nbytes in peers.items():
                sums[args["round"]][(e["name"], int(peer))] += int(nbytes)
        out[pid] = [(r, tuple(sorted((k[0], k[1], b) for k, b in kinds.items()))) for r, kinds in sorted(sums.items())]
    return out


def round_times(trace: dict, algorithm: str | None = None, nbytes: int | None = None) -> dict:
    """Per round, the median over ranks and collectives of the round slice's duration in seconds,
    for the collectives of ``algorithm`` and ``nbytes`` (default: all): {round: seconds}."""
    samples = defaultdict(list)
    for c in collectives(trace):
        if algorithm is not None and c["args"].get("algorithm") != algorithm:
            continue
        if nbytes is not None and c["args"].get("bytes") != nbytes:
            continue
        for r in c["rounds"]:
            samples[r["args"]["round"]].append(r["dur"] * 1e-6)
    return {r: statistics.median(v) for r, v in sorted(samples.items())}


def compare(measured: dict, simulated: dict) -> dict:
    """Per round, the measured median duration beside the simulated one, for the collective the
    simulated trace holds (its algorithm and size); where the gap is largest; and the median
    relative error over rounds. ConfigError if the measured trace holds no such collective."""
    info = simulated.get("otherData", {}).get("gradsync", {})
    if info.get("kind") != "simulated":
        raise ConfigError("the second trace must be a simulated one (gradsync simulate --trace)")
    algorithm, nbytes = info.get("algorithm"), info.get("bytes")
    got = round_times(measured, algorithm, nbytes)
    if not got:
        held = sorted({(c["args"].get("algorithm"), c["args"].get("bytes")) for c in collectives(measured)},
                      key=str)
        raise ConfigError(f"the measured trace holds no {algorithm} all-reduce of {nbytes} bytes; it holds "
                          f"{', '.join(f'{a} of {b} bytes' for a, b in held) or 'no collectives'}")
    predicted = round_times(simulated)
    rows = []
    for r in sorted(set(got) | set(predicted)):
        m, p = got.get(r), predicted.get(r)
        rows.append({"round": r, "measured_s": m, "predicted_s": p,
                     "gap_s": None if m is None or p is None else m - p,
                     "error": None if m is None or not p else m / p - 1})
    both = [row for row in rows if row["gap_s"] is not None]
    largest = max(both, key=lambda row: abs(row["gap_s"]), default=None)
    errors = [abs(row["error"]) for row in both if row["error"] is not None]
    return {"algorithm": algorithm, "bytes": nbytes, "rounds": rows,
            "largest_gap_round": None if largest is None else largest["round"],
            "median_abs_error": statistics.median(errors) if errors else None,
            "measured_total_s": sum(row["measured_s"] or 0 for row in rows),
            "predicted_total_s": sum(row["predicted_s"] or 0 for row in rows)}


def merge(traces: list[dict]) -> dict:
    """One trace from several (each rank's, already on one clock): their events together, and
    what each says of itself (rank, clock offset) under ``otherData.gradsync.ranks``.

    >>> a = document([complete("x", "t", 0, 0, 1)], "measured", rank=0)
    >>> len(merge([a, a])["traceEvents"]), merge([a, a])["otherData"]["gradsync"]["ranks"][1]["rank"]
    (2, 0)
    """
    if not traces:
        raise ConfigError("nothing to merge: no traces given")
    events = [e for t in traces for e in t["traceEvents"]]
    infos = [t.get("otherData", {}).get("gradsync", {}) for t in traces]
    kind = infos[0].get("kind", "measured")
    return document(events, kind, ranks=infos)
