"""The commands that choose an algorithm from the models of time, running nothing: tune (the
fastest per size, and on a GPU machine the protocol, beside NCCL's own choice) and explain (why).
"""

from __future__ import annotations

import json

import click
import numpy as np

from .common import (Size, _affordable, _chosen, _codecs, _elements, _emit, _png, _print_table, _tuned_topology,
                     compression_option, dtype_option, format_option, main, topology_option, workers_option)
from .. import dtypes
from ..model.tune import default_candidates, skipped, table
from ..units import format_size, format_time
from .models import _codec_rows


NCCL_FAMILY = {"ring": "nccl_ring", "tree": "nccl_tree", "nvls": "nvls", "nvls_tree": "nvls_tree"}


def _cells(row):
    """A row's times per algorithm: on a GPU machine the fastest protocol of each (its name in the
    cell), a closed form's time marked with '*'."""
    out = {}
    for label, seconds in row["times_s"].items():
        name, _, protocol = label.partition("/")
        if name not in out or seconds < out[name][0]:
            out[name] = (seconds, protocol, row.get("predicted_by", {}).get(label) == "closed form")
    return {name: format_time(t) + ("*" if closed else "") + (f" {p}" if p else "") for name, (t, p, closed) in out.items()}


def _render_tune(o, rows, topo, plot):
    click.echo(f"{topo.name}: {topo.description or f'{len(topo.links)} links'}; {o['workers']} workers")
    cells = [_cells(r) for r in rows]
    names = list(cells[0])
    short = {a: a.replace("(components=", " c=").replace("(", " ").replace(")", "") for a in names}
    nccl = ["NCCL would run"] if o.get("nccl") else []
    _print_table(["size", "best"] + nccl + [short[a] for a in names],
                 [[format_size(r["bytes"]), r["best"]] + (_nccl_cell(r) if nccl else []) + [c[a] for a in names]
                  for r, c in zip(rows, cells)])
    for c in o["crossovers"]:
        click.echo(f"crossover at {format_size(c['bytes'])}: {c['below']} below, {c['above']} above")
    for name, error in o["codec_errors"].items():
        click.echo(f"{name}: relative error {error:.2g} on one step of Gaussian gradients")
    if any("*" in cell for c in cells for cell in c.values()):
        click.echo("*: the closed form's time (no compact form, too many workers to simulate the table)")
    if nccl:
        click.echo("NCCL would run: the choice of NCCL's own cost model (src/graph/tuning.cc) here; '!' where the "
                   "simulator's fastest of NCCL's algorithms and protocols differs from it")
    for name, reason in o.get("skipped", {}).items():
        click.echo(f"left out: {reason}")
    if plot:
        click.echo(f"plot written to {plot}")


def _nccl_cell(row):
    n = row["nccl"]
    return [f"{n['algorithm']}/{n['protocol']}" + ("" if n["agrees"] else " !")]


def _nccl_column(topo, rows):
    """Per row, what NCCL's cost model chooses and whether the simulator's fastest among NCCL's
    algorithms (at their protocols) is the same; None off GPU machines."""
    from ..model import nccl
    if topo.gpu is None:
        return False
    system = nccl.System.of(topo)
    for r in rows:
        algorithm, protocol, seconds = nccl.choose(r["bytes"], system)
        ours = {k: v for k, v in r["times_s"].items() if k.partition("/")[0] in NCCL_FAMILY.values()}
        best = min(ours, key=ours.get) if ours else None
        mine = f"{NCCL_FAMILY.get(algorithm, algorithm)}/{protocol}"
        r["nccl"] = {"algorithm": NCCL_FAMILY.get(algorithm, algorithm), "protocol": protocol, "time_s": seconds,
                     "simulator_fastest": best, "agrees": best == mine}
    return True


@main.command()
@topology_option
@workers_option
@dtype_option
@click.option("--min-size", type=Size(), default="1KB", show_default=True)
@click.option("--max-size", type=Size(), default="1GB", show_default=True)
@click.option("--max-error", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Allow CERAR designs whose predicted relative error is within this budget.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw predicted time against size per algorithm, crossovers marked, to this PNG.")
@compression_option
@format_option
def tune(topology, workers, dtype, min_size, max_size, max_error, plot, codecs, fmt):
    """Print the fastest algorithm per message size and the sizes where the choice changes; on a GPU
    machine the NCCL protocol too, and beside it what NCCL's own cost model would run.

    Each ``--compression`` adds a column for that codec over the ring (wire simulated, compute
    at the rate measured here), which can be the best; crossovers are among the uncompressed.
    Algorithms the topology cannot run are left out, each named once.
    """
    _png(plot)
    codecs = _codecs(codecs)
    topo = _tuned_topology(topology, workers, max_error)
    _elements(min_size, dtype, "--min-size")
    _elements(max_size, dtype, "--max-size")
    if not 0 < min_size <= max_size:
        raise click.BadParameter(f"need 0 < --min-size <= --max-size, got {min_size} and {max_size}")
    itemsize, n = dtypes.itemsize(dtype), len(topo.workers)
    sizes = np.unique(np.geomspace(max(min_size, itemsize), max_size,
                                   int(np.log2(max_size / max(min_size, itemsize))) // 2 + 2).astype(np.int64))
    kind = dtype if dtype in ("float32", "float64") else "float32"
    rows, crossovers = table(topo, sizes, itemsize, max_error=max_error, dtype=kind)
    errors = {}
    for r in rows:
        for c in _codec_rows(codecs, topo, n, max(1, r["bytes"] // itemsize)):
            r["times_s"][c["algorithm"]] = c["time_s"]
            errors[c["algorithm"]] = c["error"]
        r["best"] = min(r["times_s"], key=r["times_s"].get)
    out = {"topology": topo.name, "workers": n, "rows": rows, "codec_errors": errors,
           "crossovers": [{"bytes": c.nbytes, "below": c.below, "above": c.above} for c in crossovers],
           "skipped": skipped(topo, n, [c.algorithm for c in default_candidates(n, kind, max_error)]),
           "nccl": _nccl_column(topo, rows)}
    if plot:
        from ..tools.plots import tune_plot
        tune_plot(rows, out["crossovers"], plot, f"{topo.name}, {n} workers, {dtype}: predicted time")
    _emit(fmt, out, lambda o: _render_tune(o, rows, topo, plot))


def _bench_rows(path):
    """Bench rows from a 'bench --format json' file; one line naming the file if it is not one."""
    try:
        with open(path) as fh:
            rows = json.load(fh)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc.strerror}", param_hint="'--measured'")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path!r} is not JSON: {exc}", param_hint="'--measured'")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"algorithm", "bytes", "time_s"} <= set(r)
                                             for r in rows):
        raise click.BadParameter(f"{path!r} is not the output of 'gradsync bench --format json' (a list of rows "
                                 f"with algorithm, bytes and time_s)", param_hint="'--measured'")
    return rows


def _render_explain(o, topo, n, dtype, measured):
    click.echo(f"{topo.name}: {topo.description or f'{len(topo.links)} links'}; {n} workers, {format_size(o['bytes'])} {dtype}")
    headers = ["candidate", "predicted", "by", "latency", "bandwidth", "reduction", "codec", "bottleneck link"]
    if measured:
        headers.append("measured")
    lines = []
    for r in sorted(o["candidates"], key=lambda r: r["predicted_s"]):
        line = [r["candidate"], format_time(r["predicted_s"]), r["predicted_by"]] + \
            [format_time(r[k]) for k in ("latency", "bandwidth", "reduction", "codec")] + \
            [f"{r['bottleneck']} ({r['bottleneck_busy']:.0%} busy)" if r["bottleneck"] else "-"]
        if measured:
            line.append("-" if r["measured_s"] is None else format_time(r["measured_s"]))
        lines.append(line)
    _print_table(headers, lines)
    best = next(r for r in o["candidates"] if r["candidate"] == o["winner"])
    click.echo(f"winner: {o['winner']}" + (f"; the next best, {o['runner_up']}, is predicted {o['margin']:.1%} slower"
                                          if o["margin"] is not None else "")
               + f"; its time is mostly {o['winner_dominant_term']} "
                 f"({best[o['winner_dominant_term']] / (best['closed_form'] or 1):.0%} of its closed form)")
    click.echo("predicted: the simulator's time wherever it is affordable (a compact form at any size, a table up "
               "to 64 workers), else the closed form's ('by'), as tune compares; the terms split the closed form")
    for reason in o.get("skipped", {}).values():
        click.echo(f"left out: {reason}")


@main.command("explain")
@topology_option
@click.option("--size", "-s", type=Size(), default="160MB", show_default=True, help="Message size, e.g. 64MB.")
@workers_option
@dtype_option
@click.option("--algorithms", "names", default=None,
              help="Comma-separated candidates (default: the ones auto weighs, every exact one).")
@click.option("--max-error", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Weigh CERAR designs whose predicted relative error is within this budget, as tune does.")
@click.option("--measured", type=click.Path(dir_okay=False), default=None,
              help="Rows of 'gradsync bench --format json' (after calibrate): measured time beside each prediction.")
@format_option
def explain_cmd(topology, size, workers, dtype, names, max_error, measured, fmt):
    """Why auto picks what it picks: every candidate's predicted time split into latency, bandwidth,
    reduction and codec terms, its bottleneck link, the winner and its margin."""
    from ..model.explain import explain

    topo = _tuned_topology(topology, workers, max_error)
    n, itemsize = len(topo.workers), dtypes.itemsize(dtype)
    elements = _elements(size, dtype)
    rows = _bench_rows(measured) if measured else None
    candidates = _affordable(_chosen(names, dtype), names, n) if names is not None else None
    out = explain(topo, elements * itemsize, itemsize, n, candidates, max_error,
                  dtype if dtype in ("float32", "float64") else "float32", rows)
    _emit(fmt, out, lambda o: _render_explain(o, topo, n, dtype, rows is not None))
