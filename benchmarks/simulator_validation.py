"""Simulator validation: calibrate in one launch, then measure every exact algorithm and CERAR
in another, and compare each measured time with the simulator's prediction.

Usage: python benchmarks/simulator_validation.py [--workers 2,4] [--sizes 4KB,64KB,1MB,4MB,16MB,64MB]
           [--repeats 10] [--out docs/simulator_validation.json] [--link-bandwidth 100Mbit]

Per worker count N: ``gradsync calibrate --workers N --launches 1`` (its own process group),
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
    from gradsync.cost import default_options
    from gradsync.simulate import simulate

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--sizes", default="4KB,64KB,1MB,4MB,16MB,64MB")
    parser.add_argument("--repeats", type=int, default=10, help="calibrate's repeats")
    parser.add_argument("--link-bandwidth", default=None, help="emulated links (root; see gradsync bench)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--summarize", default=None, help="recompute the summaries of a results file, in place")
    args = parser.parse_args()
    if args.summarize:
        with open(args.summarize) as fh:
            result = json.load(fh)
        for run in result["runs"]:
            print(f"N = {run['workers']}")
            report(summarize(run))
        with open(args.summarize, "w") as fh:
            json.dump(result, fh, indent=1)
        return

    from gradsync import algorithms
    from gradsync.runtime.calibrate import topology_dict
    from gradsync.topology import from_dict

    names = [a for a in algorithms.names(exact=True) if a != "hierarchical"] + ["cerar"]
    result = {"benchmark": "benchmarks/simulator_validation.py", "cpus": os.cpu_count(),
              "link": args.link_bandwidth or "loopback", "runs": []}
    for n in map(int, args.workers.split(",")):
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            link = ["--link-bandwidth", args.link_bandwidth] if args.link_bandwidth else []
            fit = gradsync("calibrate", "--workers", str(n), "--launches", "1", "--repeats", str(args.repeats),
                           "--out", os.path.join(tmp, "c.json"), "--format", "json")
            rows = gradsync("bench", "--workers", str(n), "--sizes", args.sizes, "--algorithms", ",".join(names),
                            "--format", "json", *link)
        node_model = from_dict(topology_dict(fit))
        ring_fit = from_dict(topology_dict({k: v for k, v in fit.items() if k != "node"}))
        out = []
        for r in rows:
            if r["algorithm"] not in names:
                continue
            row = {"workers": n, "algorithm": r["algorithm"], "bytes": r["bytes"], "measured_s": r["time_s"]}
            for label, topo in (("node_model", node_model), ("ring_fit", ring_fit)):
                row[f"{label}_s"] = predict(topo, r["algorithm"], n, r["count"], 2 * n)
                row[f"{label}_error"] = row[f"{label}_s"] / r["time_s"] - 1
            out.append(row)
        run = summarize({"workers": n, "load_average": [load_before, os.getloadavg()[0]],
                         "calibration": {k: fit[k] for k in ("node", "ring_check", "add_rate", "madd_rate",
                                                             "round_latency_s", "bandwidth_Bps")},
                         "rows": out})
        result["runs"].append(run)
        print(f"\nN = {n} (load average {run['load_average'][0]:.1f} -> {run['load_average'][1]:.1f})")
        print("| algorithm | size | measured | node model | error | ring fit | error |")
        print("|---|---|---|---|---|---|---|")
        for r in out:
            print(f"| {r['algorithm']} | {r['bytes']} | {r['measured_s'] * 1e3:.3f} ms | {r['node_model_s'] * 1e3:.3f} ms "
                  f"| {r['node_model_error']:+.0%} | {r['ring_fit_s'] * 1e3:.3f} ms | {r['ring_fit_error']:+.0%} |")
        report(run)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
