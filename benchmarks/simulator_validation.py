"""Simulator validation: calibrate in one launch, then measure every exact algorithm and CERAR
in another, and compare each measured time with the simulator's prediction.

Usage: python benchmarks/simulator_validation.py [--workers 2,4] [--sizes 4KB,64KB,1MB,4MB,16MB,64MB]
           [--repeats 10] [--iters K] [--out docs/results/simulator_validation.json] [--link-bandwidth 100Mbit]
       python benchmarks/simulator_validation.py --repredict FILE     (the current model on stored measurements)

Per worker count N: ``gradsync calibrate --workers N --launches 1`` (its own process group, on
the same emulated links as the bench where ``--link-bandwidth`` is given),
then ``gradsync bench --workers N`` (another), and for every row the prediction of two
topologies written from the same calibration: the node-cost model (what ``calibrate`` now
writes: latency, per-message overhead, per-node copy rate with incast, duplex) and the ring
fit (what it wrote before: per-round latency and a link bandwidth fitted to the ring).
Error = predicted / measured - 1. Summaries: median and worst |error| over all rows and over
rows >= 1 MB, per model; the same with the ring of each size as the baseline (the load of a
launch cancels); and for each size, the time lost by choosing the algorithm each model
predicts fastest instead of the measured fastest (what ``auto`` would lose). The machine's
load average is recorded: on a shared machine the measured times move with it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def gradsync(*args, timeout=3600):
    out = subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"gradsync {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def predict(topo, name, workers, count, components):
    from gradsync import algorithms
    from gradsync.model.cost import default_options
    from gradsync.model.simulate import simulate

    options = default_options(name, topo, workers)
    if name == "cerar":
        options["components"] = components
    return simulate(algorithms.build(name, workers, count, dtype="float32", **options), topo, 4).time


def summary(rows, key):
    def stats(rs):
        errors = [abs(r[key]) for r in rs]
        return {"rows": len(rs), "median_abs_error": statistics.median(errors) if errors else None,
                "worst_abs_error": max(errors) if errors else None}
    return {"all": stats(rows), "from_1MB": stats([r for r in rows if r["bytes"] >= 10**6])}


def relative_to_ring(rows, model):
    """Each row's error with the ring of its size as the baseline: (predicted / predicted ring)
    / (measured / measured ring) - 1. What a launch's load does to every algorithm alike cancels;
    what is left is the model's error in comparing algorithms, which is what ``auto`` needs."""
    ring = {r["bytes"]: r for r in rows if r["algorithm"] == "ring"}
    out = []
    for r in rows:
        if r["algorithm"] != "ring" and r["bytes"] in ring:
            g = ring[r["bytes"]]
            out.append({**r, "error": (r[f"{model}_s"] / g[f"{model}_s"]) / (r["measured_s"] / g["measured_s"]) - 1})
    return out


def summarize(run):
    """The run's summaries: absolute errors, errors relative to the ring, and choices."""
    rows = run["rows"]
    models = ("node_model", "ring_fit")
    run["summary"] = {m: summary(rows, f"{m}_error") for m in models}
    run["summary_relative_to_ring"] = {m: summary(relative_to_ring(rows, m), "error") for m in models}
    run["choice"] = {m: choice_loss(rows, f"{m}_s") for m in models}
    return run


def choice_loss(rows, key):
    """Per size: the algorithm with the least predicted time, and its measured time over the measured best's."""
    out = []
    for size in sorted({r["bytes"] for r in rows}):
        at = [r for r in rows if r["bytes"] == size]
        best = min(at, key=lambda r: r["measured_s"])
        chosen = min(at, key=lambda r: r[key])
        out.append({"bytes": size, "measured_fastest": best["algorithm"], "chosen": chosen["algorithm"],
                    "time_lost": chosen["measured_s"] / best["measured_s"] - 1})
    return out


def report(run):
    for m in ("node_model", "ring_fit"):
        s, rel = run["summary"][m], run["summary_relative_to_ring"][m]
        lost = max(c["time_lost"] for c in run["choice"][m])
        print(f"{m}: median |error| {s['all']['median_abs_error']:.0%} (>= 1 MB: "
              f"{s['from_1MB']['median_abs_error']:.0%}), worst {s['all']['worst_abs_error']:.0%} "
              f"(>= 1 MB: {s['from_1MB']['worst_abs_error']:.0%}); relative to the ring: median "
              f"{rel['all']['median_abs_error']:.0%} (>= 1 MB: {rel['from_1MB']['median_abs_error']:.0%}), worst "
              f"{rel['all']['worst_abs_error']:.0%}; choosing by it loses at most {lost:.0%}", flush=True)


def refit(calibration: dict) -> dict:
    """The calibration as the current code fits it: from the launches' raw measurements where
    the run kept them, so that a change to the fitting is judged on the same measurements."""
    from gradsync.tools.calibrate import fit_launches

    if "launches" not in calibration:
        return calibration
    launches = [{"sizes": calibration["fit_sizes"], **r} for r in calibration["launches"]]    # older runs lack sizes
    fit = fit_launches(calibration["workers"], launches)
    if calibration.get("link_Bps"):
        fit["link_Bps"] = calibration["link_Bps"]
    return fit


def predictions(run: dict) -> dict:
    """Each row's predicted times and errors under the two models built from the run's calibration."""
    from gradsync.tools.calibrate import topology_dict
    from gradsync.model.topology import from_dict

    fit = refit({"workers": run["workers"], **run["calibration"]})
    run["model"] = {k: v for k, v in fit.items() if k != "launches"}
    n = run["workers"]
    node_model = from_dict(topology_dict(fit))
    ring_fit = from_dict(topology_dict({k: v for k, v in fit.items() if k != "node"}))
    for row in run["rows"]:
        for label, topo in (("node_model", node_model), ("ring_fit", ring_fit)):
            row[f"{label}_s"] = predict(topo, row["algorithm"], n, row.get("count", row["bytes"] // 4), 2 * n)
            row[f"{label}_error"] = row[f"{label}_s"] / row["measured_s"] - 1
    return summarize(run)


def table(run):
    print(f"\nN = {run['workers']} (load average {run['load_average'][0]:.1f} -> {run['load_average'][1]:.1f})")
    print("| algorithm | size | measured | node model | error | ring fit | error |")
    print("|---|---|---|---|---|---|---|")
    for r in run["rows"]:
        print(f"| {r['algorithm']} | {r['bytes']} | {r['measured_s'] * 1e3:.3f} ms | {r['node_model_s'] * 1e3:.3f} ms "
              f"| {r['node_model_error']:+.0%} | {r['ring_fit_s'] * 1e3:.3f} ms | {r['ring_fit_error']:+.0%} |")


def markdown(result: dict) -> str:
    """Per run: a table of measured time and the calibrated model's error per algorithm and size,
    the run's summary, and what choosing by the model loses per size."""
    from gradsync.units import format_size, format_time

    out = []
    for run in sorted(result["runs"], key=lambda r: r["workers"]):
        sizes = sorted({r["bytes"] for r in run["rows"]})
        cal = run.get("model", run["calibration"])["node"]
        out.append(f"#### {result['link']}, N = {run['workers']} (load average {run['load_average'][0]:.1f} before, "
                   f"{run['load_average'][1]:.1f} after)\n")
        out.append(f"Calibrated: {cal['latency_s'] * 1e6:.0f} us latency, {cal['message_overhead_s'] * 1e6:.0f} us per "
                   f"message, {cal.get('round_overhead_s', 0) * 1e6:.0f} us per round, "
                   f"{cal.get('collective_overhead_s', 0) * 1e6:.0f} us per collective, "
                   + f"{cal['copy_rate_Bps'] / 1e9:.3g} GB/s per node ({cal['duplex']} duplex), "
                   f"{cal['machine_copy_rate_Bps'] / 1e9:.3g} GB/s for the machine"
                   + (f"; two disjoint transfers moved {cal['pairs_over_one_way']:.2f} x one" if cal.get("pairs_over_one_way")
                      else "") + ".\n")
        out.append("| algorithm | " + " | ".join(format_size(n) for n in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        for name in dict.fromkeys(r["algorithm"] for r in run["rows"]):
            cells = {r["bytes"]: r for r in run["rows"] if r["algorithm"] == name}
            out.append(f"| {name} | " + " | ".join(
                f"{format_time(cells[n]['measured_s'])} {cells[n]['node_model_error']:+.0%}" if n in cells else ""
                for n in sizes) + " |")
        s, rel = run["summary"]["node_model"], run["summary_relative_to_ring"]["node_model"]
        old_s = run["summary"]["ring_fit"]
        choice = run["choice"]["node_model"]
        out.append(f"\nFrom 1 MB: median |error| **{s['from_1MB']['median_abs_error']:.0%}**, worst "
                   f"**{s['from_1MB']['worst_abs_error']:.0%}** (ring fit alone: {old_s['from_1MB']['median_abs_error']:.0%}"
                   f", {old_s['from_1MB']['worst_abs_error']:.0%}); all sizes: {s['all']['median_abs_error']:.0%}, "
                   f"{s['all']['worst_abs_error']:.0%}; relative to the ring from 1 MB: "
                   f"{rel['from_1MB']['median_abs_error']:.0%}, {rel['from_1MB']['worst_abs_error']:.0%}. Choosing by "
                   "the model (measured fastest / chosen, time lost): "
                   + "; ".join(f"{format_size(c['bytes'])} {c['measured_fastest']} / {c['chosen']} {c['time_lost']:.0%}"
                               for c in choice) + ".\n")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--sizes", default="4KB,64KB,1MB,4MB,16MB,64MB")
    parser.add_argument("--repeats", type=int, default=10, help="calibrate's repeats")
    parser.add_argument("--iters", type=int, default=None, help="bench's timed iterations (default: by size)")
    parser.add_argument("--link-bandwidth", default=None, help="emulated links (root; see gradsync bench)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--summarize", default=None, help="recompute the summaries of a results file, in place")
    parser.add_argument("--repredict", default=None,
                        help="recompute a results file's predictions (and summaries) in place with the current "
                             "model, refitting its calibration's raw measurements")
    parser.add_argument("--markdown", default=None, help="print a results file's tables for docs/simulator.md")
    args = parser.parse_args()
    if args.markdown:
        with open(args.markdown) as fh:
            print(markdown(json.load(fh)))
        return
    if args.summarize or args.repredict:
        path = args.summarize or args.repredict
        with open(path) as fh:
            result = json.load(fh)
        for run in result["runs"]:
            if args.repredict:
                predictions(run)
                table(run)
            else:
                print(f"N = {run['workers']}")
            report(summarize(run))
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1)
        return

    from gradsync import algorithms
    from gradsync.tools import calibrate   # noqa: F401  (imported now: a run takes minutes)
    from gradsync.model.topology import files   # noqa: F401

    names = [a for a in algorithms.names(exact=True) if a != "hierarchical"] + ["cerar"]
    result = {"benchmark": "benchmarks/simulator_validation.py", "cpus": os.cpu_count(),
              "link": args.link_bandwidth or "loopback", "runs": []}
    if args.out and os.path.exists(args.out):         # add to a file of other worker counts
        with open(args.out) as fh:
            result["runs"] = [r for r in json.load(fh)["runs"] if str(r["workers"]) not in args.workers.split(",")]
    for n in map(int, args.workers.split(",")):
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            link = ["--link-bandwidth", args.link_bandwidth] if args.link_bandwidth else []
            iters = ["--iters", str(args.iters)] if args.iters else []
            fit = gradsync("calibrate", "--workers", str(n), "--launches", "1", "--repeats", str(args.repeats),
                           "--out", os.path.join(tmp, "c.json"), "--format", "json", *link)
            rows = gradsync("bench", "--workers", str(n), "--sizes", args.sizes, "--algorithms", ",".join(names),
                            "--format", "json", *link, *iters)
        out = [{"workers": n, "algorithm": r["algorithm"], "bytes": r["bytes"], "count": r["count"],
                "measured_s": r["time_s"]} for r in rows if r["algorithm"] in names]
        run = {"workers": n, "load_average": [load_before, os.getloadavg()[0]], "calibration": fit, "rows": out}
        result["runs"].append(run)
        if args.out:                      # the measurements first: --repredict can redo the rest
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
        predictions(run)
        table(run)
        report(run)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
