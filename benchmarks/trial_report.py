"""Verdicts and tables of the backend trials (``benchmarks/backend_trials.py``).

Each survivor of a trial gets one verdict, the first that applies:

- ``hang``: still running ``--timeout`` + ``--hang-margin`` s after the fault (killed by the harness);
- ``wrong result``: reported success with parameters that differ from the one-process
  reference by more than 1e-9 (float64);
- ``crash``: ended by SIGSEGV, SIGABRT, SIGBUS, SIGILL or SIGFPE (whatever it raised before);
- ``named``: raised an error naming the victim (its ``peer``, or "rank V" in its text) within
  the group's timeout + 2 s of the fault;
- ``named late``: the same, later;
- ``named in a subgroup``: named the victim only by its rank in a DeviceMesh subgroup;
- ``error not naming``: raised an error that does not name the victim;
- ``ok``: reported success with the reference's parameters (a fault after the work was done);
- ``ended by <signal>`` / ``ended silently (exit N)``: no error recorded.

Example: ``judge(run(plan, args), args, references(args, plans, run))["survivors"]``.
"""

from __future__ import annotations

import re
import shutil
import statistics
from collections import Counter

import torch

import trial_job

CRASHES = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE"}
TOLERANCE = 1e-9


def references(args, plans, run) -> dict:
    """The one-process reference parameters; under --elastic also, per kind, an uninterrupted
    run of the same job on Gloo (its rank 0's final parameters)."""
    refs = {"one_process": trial_job.reference(args.seed, args.steps), "gloo": {}}
    if args.elastic:
        for kind in sorted({p["kind"] for p in plans}):
            facts = run({"trial": "gloo-reference", "kind": kind, "fault": None}, args, backend="gloo")
            refs["gloo"][kind] = torch.load(f"{facts['folder']}/a0-rank0.pt")
            print(f"Gloo reference for {kind}: {facts['wall_s']} s", flush=True)
            if not args.keep:
                shutil.rmtree(facts["folder"], ignore_errors=True)
    return refs


def difference(folder: str, name: str, ref: dict) -> float | None:
    """max |parameter - reference| of ``name``'s saved parameters, or None if it saved none."""
    try:
        mine = torch.load(f"{folder}/{name}.pt")
    except OSError:
        return None
    if set(mine) != set(ref):
        return float("inf")
    return max((mine[k] - ref[k]).abs().max().item() for k in ref)


def names(record: dict, victim: int, kind: str) -> str | None:
    """"global" if the error names the victim's rank (its ``peer``, else its text when it has no
    ``peer``), "group" if HSDP's error names only the victim's rank in one of the 2 x 2 mesh's
    subgroups (shard: V % 2, replicate: V // 2) as its ``peer``."""
    peer = record.get("peer")
    if peer == victim or (peer is None and re.search(rf"\brank {victim}\b", record.get("text", ""), re.I)):
        return "global"
    if kind == "hsdp" and peer in (victim % 2, victim // 2):
        return "group"
    return None


def survivor(w: dict, facts: dict, args, refs: dict) -> dict:
    """One survivor's row: its error, exit, times from the fault, verdict."""
    fault, note = facts["fault"], facts["note"]
    t0 = note["t"] if note else None
    rec = facts["records"].get(f"a{w['attempt']}-rank{w['rank']}") or {}
    row = {"rank": w["rank"], "pid": w["pid"], "exit": w["exit"], "hung": bool(w.get("hung")),
           "outcome": rec.get("outcome"), "type": rec.get("type"), "first_line": rec.get("first_line"),
           "peer": rec.get("peer"), "doing": rec.get("doing"), "step": rec.get("step"), "where": rec.get("where"),
           "error_s": round(rec["t"] - t0, 3) if t0 and rec.get("outcome") == "error" else None,
           "waited_s": waited(rec, t0),
           "exit_s": round(w["ended"] - t0, 3) if t0 and w["ended"] else None}
    if rec.get("outcome") == "ok":
        row["difference"] = difference(facts["folder"], f"a{w['attempt']}-rank{w['rank']}", refs["one_process"])
    row["named"] = names(rec, fault["rank"], facts["kind"]) if fault and rec.get("outcome") == "error" else None
    row["verdict"] = verdict(row, args.timeout)
    if row["verdict"] in ("crash", "hang") or (row["exit"] or {}).get("signal"):
        row["stderr"] = facts["stderr"].get(f"a{w['attempt']}-rank{w['rank']}", [])[-60:]
        row["crash"] = crash_where(row["stderr"])
    return row


def crash_where(stderr: list[str]) -> str:
    """faulthandler's first line and the innermost frame of the thread that crashed, as
    "Fatal Python error: Segmentation fault in torch/autograd/graph.py:979 _engine_run_backward"
    (a hang's dump: "stack in ...")."""
    head = next((x for x in stderr if x.startswith("Fatal Python error")), "stack")
    at = next((i for i, x in enumerate(stderr) if x.startswith("Current thread")), None)
    if at is None or at + 1 >= len(stderr):
        return "" if head == "stack" else head
    m = re.search(r'File "(?:.*?/(?:site-packages|src)/)?([^"]+)", line (\d+) in (\S+)', stderr[at + 1])
    return f"{head} in {m.group(1)}:{m.group(2)} {m.group(3)}" if m else head


def waited(rec: dict, t0: float | None) -> float | None:
    """Seconds from the fault, or from this rank's entry into the phase it failed in if that
    came later (a survivor that reached its collective after the fault waited from there)."""
    if not t0 or rec.get("outcome") != "error":
        return None
    entered = max((t for _, _, t in rec.get("timeline", []) if t <= rec["t"]), default=t0)
    return round(rec["t"] - max(t0, entered), 3)


def verdict(row: dict, timeout: float) -> str:
    sig = (row["exit"] or {}).get("signal")
    if row["hung"]:
        return "hang"
    if row["outcome"] == "ok" and (row.get("difference") is None or row["difference"] > TOLERANCE):
        return "wrong result"
    if sig in CRASHES:
        return "crash"
    if row["outcome"] == "error":
        if row["named"] == "global":
            return "named" if row["waited_s"] is not None and row["waited_s"] <= timeout + 2 else "named late"
        return "named in a subgroup" if row["named"] == "group" else "error not naming"
    if row["outcome"] == "ok":
        return "ok"
    return f"ended by {sig}" if sig else f"ended silently ({row['exit']})"


def judge(facts: dict, args, refs: dict) -> dict:
    """The trial's facts with every survivor's row (the victim's apart) and its verdict."""
    fault = facts["fault"]
    first = [w for w in facts["workers"] if w["attempt"] == 0]
    rows = [survivor(w, facts, args, refs) for w in first if not fault or w["rank"] != fault["rank"]]
    victim = next((w for w in first if fault and w["rank"] == fault["rank"]), None)
    out = {k: facts[k] for k in ("trial", "kind", "fault", "backend", "folder", "note", "wall_s", "machine_stall_s",
                                 "agent_rc", "hung_ranks",
                                 "victim_after_cont", "processes_left", "segments_left", "torchrun_tail")}
    out["survivors"] = rows
    out["victim"] = None if victim is None else {
        "exit": victim["exit"], "record": facts["records"].get(f"a0-rank{victim['rank']}"),
        "stderr": facts["stderr"].get(f"a0-rank{victim['rank']}", [])[-15:] if victim.get("resumed") else []}
    if facts["elastic"]:
        out["elastic"] = elastic_outcome(facts, refs)
    return out


def elastic_outcome(facts: dict, refs: dict) -> dict:
    """Under --elastic: the last attempt's ranks, where they resumed, their weights against Gloo's."""
    last = max((w["attempt"] for w in facts["workers"]), default=0)
    ranks = sorted(w["rank"] for w in facts["workers"] if w["attempt"] == last)
    recs = [facts["records"].get(f"a{last}-rank{r}") or {} for r in ranks]
    diffs = [difference(facts["folder"], f"a{last}-rank{r}", refs["gloo"][facts["kind"]]) for r in ranks]
    ref_diffs = [difference(facts["folder"], f"a{last}-rank{r}", refs["one_process"]) for r in ranks]
    finished = len(recs) == 4 and all(r.get("outcome") == "ok" for r in recs)
    same = finished and all(d is not None and d <= TOLERANCE for d in diffs)
    return {"attempts": last + 1, "resumed_from_step": recs[0].get("start") if recs else None,
            "finished": finished, "max_difference_from_gloo": max((d for d in diffs if d is not None), default=None),
            "max_difference_from_one_process": max((d for d in ref_diffs if d is not None), default=None),
            "bitwise_equal_to_gloo": finished and all(d == 0.0 for d in diffs), "same_weights": same,
            "first_attempt_exits": {w["rank"]: w["exit"] for w in facts["workers"] if w["attempt"] == 0}}


def line(trial: dict, total: int) -> str:
    """One line of progress for a finished trial."""
    f = trial["fault"]
    what = "control" if not f else f"{f['signal']} rank {f['rank']} at {f['phase']}" + \
        (f" step {f['step']}" if f["phase"] == "training" else "") + f" +{f['delay']} s"
    if trial["note"]:
        what += f" (landed in {trial['note']['doing']})"
    verdicts = Counter(r["verdict"] for r in trial["survivors"])
    extra = f", elastic {trial['elastic']}" if "elastic" in trial else ""
    left = f", {len(trial['segments_left'])} segments, {len(trial['processes_left'])} processes left" \
        if trial["segments_left"] or trial["processes_left"] else ""
    stall = f" (the machine stalled {trial['machine_stall_s']} s)" if trial["machine_stall_s"] > 1 else ""
    return f"{trial['trial'] + 1}/{total} {trial['kind']} {what}: {dict(verdicts)}{left}{extra}, {trial['wall_s']} s{stall}"


def tally(trials: list[dict], timeout: float) -> dict:
    """The figures of a set of trials (docs/reliability.md says what each means)."""
    rows = [r for t in trials for r in t["survivors"] if t["fault"]]
    controls = [t for t in trials if not t["fault"]]
    named = [r["waited_s"] for r in rows if r["verdict"] == "named"]
    v = Counter(r["verdict"] for r in rows)
    return {"trials": len(trials), "controls": len(controls),
            "controls_wrong_or_failed": sum(any(r["verdict"] != "ok" for r in t["survivors"]) for t in controls),
            "survivors": len(rows), "named_within_timeout_plus_2s": v["named"],
            "expected_to_name": len(rows) - v["ok"],
            "crashes": v["crash"] + sum(r["verdict"] == "crash" for t in controls for r in t["survivors"]),
            "trials_with_a_crash": sum(any(r["verdict"] == "crash" for r in t["survivors"]) for t in trials),
            "hangs": sum(bool(t["hung_ranks"]) for t in trials),
            "wrong_results": sum(r["verdict"] == "wrong result" for t in trials for r in t["survivors"]),
            "segments_left": sum(len(t["segments_left"]) for t in trials),
            "processes_left": sum(len(t["processes_left"]) for t in trials),
            "detection_p50_s": round(statistics.median(named), 3) if named else None,
            "detection_max_s": max(named) if named else None, "verdicts": dict(v)}


def summarize(results: list[dict], args) -> dict:
    """The tally over all trials, by kind, by phase the fault landed in, and by fault; the
    distinct failure modes (verdict, kind, where it landed, first line) with their counts."""
    def landed(t):
        return t["note"]["doing"] if t["note"] else (t["fault"] or {}).get("phase", "control")
    groups = {"all": results}
    for key, of in (("kind", lambda t: t["kind"]), ("landed", landed),
                    ("fault", lambda t: (t["fault"] or {}).get("signal", "none"))):
        for t in results:
            groups.setdefault(f"{key}={of(t)}", []).append(t)
    modes = Counter((r["verdict"], t["kind"], landed(t), (t["fault"] or {}).get("signal"),
                     (r.get("crash") or r["first_line"] or "")[:160])
                    for t in results for r in t["survivors"] if r["verdict"] not in ("named", "ok"))
    out = {"timeout_s": args.timeout, "backend": args.backend, "groups": {k: tally(v, args.timeout) for k, v in groups.items()},
           "failure_modes": [{"count": n, "verdict": m[0], "kind": m[1], "landed": m[2], "fault": m[3], "line": m[4]}
                             for m, n in modes.most_common()]}
    if args.elastic:
        el = [t["elastic"] for t in results]
        out["elastic"] = {"kills": len(el), "finished": sum(e["finished"] for e in el),
                          "same_weights_as_gloo": sum(e["same_weights"] for e in el),
                          "bitwise_equal_to_gloo": sum(e["bitwise_equal_to_gloo"] for e in el),
                          "max_difference_from_gloo": max((e["max_difference_from_gloo"] or 0.0) for e in el)}
    return out


COLUMNS = [("trials", "trials"), ("controls", "controls"), ("survivors", "survivors"),
           ("named_within_timeout_plus_2s", "named <= T+2 s"), ("expected_to_name", "of"),
           ("crashes", "segfaults/aborts"), ("hangs", "hangs"), ("wrong_results", "wrong"),
           ("segments_left", "segments left"), ("processes_left", "processes left"),
           ("detection_p50_s", "p50 s"), ("detection_max_s", "max s")]


def tables(summary: dict, args) -> str:
    """The summary as markdown: one row per group, then the failure modes."""
    head = "| group | " + " | ".join(c for _, c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, t in summary["groups"].items():
        lines.append(f"| {name} | " + " | ".join(str(t[k]) for k, _ in COLUMNS) + " |")
    lines += ["", "| count | verdict | kind | landed in | fault | survivor's first line |", "|---|---|---|---|---|---|"]
    for m in summary["failure_modes"]:
        lines.append(f"| {m['count']} | {m['verdict']} | {m['kind']} | {m['landed']} | {m['fault']} | "
                     f"{m['line'].replace('|', '/')} |")
    if "elastic" in summary:
        lines += ["", f"elastic: {summary['elastic']}"]
    return "\n".join(lines)
