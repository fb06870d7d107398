"""The events of a Chrome trace file (the JSON trace event format that ui.perfetto.dev and
chrome://tracing open), as both a measured run (``gradsync.runtime.tracing``) and a simulated
one (``gradsync.tools.trace_files``) write them; the layout is described there.
"""

from __future__ import annotations

TRANSFER_KINDS = ("send", "recv wait", "send wait", "reduce", "copy", "local")
STRUCTURAL = ("send", "recv wait", "reduce")     # what a measured and a simulated trace share
METADATA = ("process_name", "thread_name", "process_sort_index", "thread_sort_index")


def metadata(pid: int, name: str, tid: int | None = None) -> list[dict]:
    """Name a process (``tid`` None) or a thread: ``metadata(0, "rank 0")[0]["name"] == "process_name"``."""
    if tid is None:
        return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}]


def complete(name: str, cat: str, pid: int, ts_us: float, dur_us: float, args: dict | None = None,
             tid: int = 0) -> dict:
    """One "X" event: ``complete("round 0", "round", 1, 10.0, 2.5)["dur"] == 2.5``."""
    event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts_us, "dur": max(dur_us, 0.0)}
    if args:
        event["args"] = args
    return event


def document(events: list[dict], kind: str, **info) -> dict:
    """A whole trace file: events plus what it is (``kind`` "measured" or "simulated")."""
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"gradsync": {"kind": kind, **info}}}


def round_slices(events: list[dict], pid: int, end_us: float) -> list[dict]:
    """Round slices for one collective of one rank, from its transfer events (each with args
    ``round``), in the order they happened: round r runs from its first event to the first
    event of the next round (when pieces of two rounds interleave, a late piece of round r sits
    in round r + 1's slice; its args still say r), the last to ``end_us``."""
    starts: dict[int, float] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        starts.setdefault(e["args"]["round"], e["ts"])
    order = sorted(starts.items(), key=lambda item: item[1])
    out = []
    for k, (r, ts) in enumerate(order):
        end = order[k + 1][1] if k + 1 < len(order) else max(end_us, ts)
        out.append(complete(f"round {r}", "round", pid, ts, end - ts, {"round": r}))
    return out
