"""Reading Chrome traces (the layout is in ``gradsync.tools.trace_files``): checking a file
against the format, finding its collectives, what they move without their timing, their
rounds' times, a measured trace beside a simulated one, and several ranks' traces as one.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import numpy as np

from ...errors import ConfigError
from ...core.trace_events import METADATA, STRUCTURAL, document


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
    relative error over rounds. One sign convention, as ``bench`` has it: ``error`` is
    (simulated - measured) / measured and ``gap_s`` simulated - measured, so + means the
    simulator predicted more time. The totals: each side's rounds summed, and each side's
    whole collective (measured: the median call, as bench times it, which adds the agreement,
    set-up and finishing outside the rounds; simulated: the simulation's end, where one rank's
    rounds overlap another's). ConfigError if the measured trace holds no such collective."""
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
                     "gap_s": None if m is None or p is None else p - m,
                     "error": None if p is None or not m else (p - m) / m})
    both = [row for row in rows if row["gap_s"] is not None]
    largest = max(both, key=lambda row: abs(row["gap_s"]), default=None)
    errors = [abs(row["error"]) for row in both if row["error"] is not None]
    calls = [c["dur"] * 1e-6 for c in collectives(measured)
             if c["args"].get("algorithm") == algorithm and c["args"].get("bytes") == nbytes]
    return {"algorithm": algorithm, "bytes": nbytes, "rounds": rows,
            "largest_gap_round": None if largest is None else largest["round"],
            "median_abs_error": statistics.median(errors) if errors else None,
            "measured_total_s": sum(row["measured_s"] or 0 for row in rows),
            "predicted_total_s": sum(row["predicted_s"] or 0 for row in rows),
            "measured_call_s": statistics.median(calls) if calls else None,
            "predicted_call_s": max((c["dur"] * 1e-6 for c in collectives(simulated)), default=None)}


def merge(traces: list[dict]) -> dict:
    """One trace from several (each rank's, already on one clock): their events together, and
    what each says of itself (rank, clock offset) under ``otherData.gradsync.ranks``.

    >>> from gradsync.core.trace_events import complete
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
