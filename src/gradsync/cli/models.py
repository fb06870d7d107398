"""The commands that ask the models of time, running nothing: compare, simulate, tune, explain.

>>> _parse_options(["segments=16", "construction=unity"])
{'segments': 16, 'construction': 'unity'}
"""

from __future__ import annotations

import json
import time

import click
import numpy as np

from . import common
from .common import (Size, _affordable, _chosen, _codecs, _elements, _emit, _png, _print_table, _steps, _topology,
                     _tuned_topology, _writable, _write_json, compression_option, dtype_option, format_option, main,
                     topology_option, workers_option)
from .. import algorithms, dtypes
from ..algorithms import _compact
from ..errors import ConfigError
from ..model.cost import default_options, net_for, predict, uniform
from ..model.simulate import simulate
from ..model.simulate.result import EXPAND_ON_LOAD
from ..model.tune import table
from ..tools.report import bus_bandwidth
from ..units import format_size, format_time

OPTION_LIMITS = {"components": common.MAX_COMPONENTS, "segments": 4096}   # larger ones take minutes to build

# Measured (benchmarks/simulate_scaling.py): seconds and peak bytes per flow of a compact block (run one
# by one) or transfer of a table (many at each event); a cluster topology's bytes per GPU.
COMPACT_WORKERS = (65536, "measured up to 65,536 (a ring of 65,536 on a rail cluster: 20 s of CPU, 0.84 GB)")
TABLE_WORKERS = (1024, "{algorithm} has no compact form here, so every transfer is simulated: a table of 2.1 "
                       "million transfers (a ring of 1024 workers) took 4.8 s of CPU and 0.5 GB, one of 33 million "
                       "(4096 workers) did not finish in 5 minutes")
COST_PER, BYTES_PER_WORKER = {"flows": (1.2e-5, 700), "transfers": (2.5e-6, 250)}, 4_000


def _parse_options(pairs) -> dict:
    """The ``-o KEY=VALUE`` pairs as a dict, each value JSON when it parses as JSON, else text."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="'--option'")
        try:
            options[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            options[key] = value
        most = OPTION_LIMITS.get(key)
        if most is not None and isinstance(options[key], (int, float)) and options[key] > most:
            raise click.BadParameter(f"{key} must be at most {most}, got {options[key]!r}", param_hint="'--option'")
    return options


def _predicted_error(schedule, dtype) -> float:
    """The relative error CERAR's design predicts for ``schedule`` (0 for an exact one)."""
    if schedule.codec is None:
        return 0.0
    from ..coding import cerar
    return cerar.Design.from_dict(schedule.codec).predicted_error(dtype if dtype in cerar.UNIT_ROUNDOFF else "float32")


def _codec_rows(codecs, topo, n, elements, over="ring") -> list[dict]:
    """Predicted time (simulated wire plus measured codec compute) and one-step error of each
    codec over the ``over`` schedule, for compare and tune: ``_codec_rows(["fp16"], topo, 4, 1000)``."""
    from ..tools.codec_predict import one_step_error, predict as predict_codec
    rows = []
    for c in codecs:
        p = predict_codec(c, over, topo, elements, n, default_options(over, topo, n))
        rows.append({"algorithm": f"{over}+{c}", "compression": c, **p, "error": one_step_error(c, n)})
    return rows


def _bandwidths_GBps(nbytes, seconds, workers):
    """(algbw, busbw) in GB/s, both infinite for a zero time: ``_bandwidths_GBps(16e6, 0.01, 4)``."""
    if seconds <= 0:
        return float("inf"), float("inf")
    return nbytes / seconds / 1e9, bus_bandwidth(nbytes, seconds, workers) / 1e9


def _compare_row(name, topo, n, elements, dtype, components, names):
    """compare's row for algorithm ``name``: simulated and closed-form time, busiest link, algbw
    and busbw, error; None for CERAR's default design refused in this dtype when not asked for."""
    itemsize = dtypes.itemsize(dtype)
    nbytes = elements * itemsize
    options = default_options(name, topo, n)
    if "components" in algorithms.get(name).options:
        options["components"] = components
    try:
        schedule = _compact.build(name, n, elements, **options) or \
            algorithms.build(name, n, elements, dtype=dtype, **options)         # CERAR: its best design
    except ConfigError:
        if names is not None or components is not None or algorithms.get(name).exact:
            raise
        return None         # not asked for: CERAR's default design refused in float16, as it is for int32
    result = simulate(schedule, topo, itemsize)
    link, link_bytes = result.busiest_channel()
    options = {k: v for k, v in options.items() if k not in ("construction",)}
    algbw, busbw = _bandwidths_GBps(nbytes, result.time, n)
    row = {"algorithm": name, "time_s": result.time,
           "closed_form_s": predict(name, topo, n, nbytes, itemsize, **options),
           "busiest_link": link, "busiest_link_bytes": link_bytes,
           "algbw_GBps": algbw, "busbw_GBps": busbw, "error": _predicted_error(schedule, dtype)}
    if "components" in schedule.options:
        row["components"] = schedule.options["components"]
    if name == "ring":
        net = net_for(topo, n, options)
        bandwidth = sum(1 / b for b in net.ring_betas) if net.ring_betas else 1 / net.beta
        row["approx_2n_over_B_s"] = 2 * nbytes / bandwidth
        row["approx_bandwidth_Bps"] = bandwidth
    return row


def _render_compare(rows, topo, n, nbytes, dtype, codecs):
    click.echo(f"{topo.name}: {topo.description or f'{len(topo.links)} links'}; {n} workers, {format_size(nbytes)} {dtype}")
    _print_table(["algorithm", "simulated", "closed form", "busiest link", "bytes on it", "algbw",
                  "busbw", "error"],
                 [[r["algorithm"] + (f" c={r['components']}" if "components" in r else ""),
                   format_time(r["time_s"]),
                   format_time(r["closed_form_s"]) if r["closed_form_s"] is not None else "-",
                   r["busiest_link"], format_size(r["busiest_link_bytes"]), f"{r['algbw_GBps']:.3g} GB/s",
                   f"{r['busbw_GBps']:.3g} GB/s", f"{r['error']:.2g}" if r["error"] else "exact"]
                  for r in rows])
    if codecs:
        click.echo("codec rows (+): simulated wire plus the codec's compute measured here; for them 'bytes on it' "
                   "is the most one worker sends, and the error is one step's on Gaussian gradients")
    if not uniform(topo, n):
        click.echo("note: closed forms assume every pair of workers meets through one switch, at the "
                   "slowest route between neighbouring workers; routes differ on this topology, so the "
                   "simulated column is the reference")
    for r in rows:
        if "approx_2n_over_B_s" in r:
            click.echo(f"ring, large-N approximation 2n/B with B = {r['approx_bandwidth_Bps'] / 1e9:.3g} GB/s "
                       f"out of each worker: {format_time(r['approx_2n_over_B_s'])} "
                       f"(exact 2(N-1)/N n/B plus latencies: {format_time(r['closed_form_s'])})")


@main.command()
@topology_option
@click.option("--size", "-s", type=Size(), default="160MB", show_default=True, help="Gradient size, e.g. 160MB.")
@workers_option
@dtype_option
@click.option("--algorithms", "names", default=None,
              help="Comma-separated algorithms to compare (default: every one that takes the dtype; "
                   "see 'gradsync list').")
@click.option("--components", "-c", type=click.IntRange(1, common.MAX_COMPONENTS), default=None,
              help="Components, for the algorithms that take them (CERAR; default 2N).")
@compression_option
@format_option
def compare(topology, size, workers, dtype, names, components, codecs, fmt):
    """Compare strategies on a topology: simulated and closed-form time, busiest link, busbw.

    CERAR runs with its default design for the dtype (the one of least error); its row shows the
    predicted error. A c whose design would be too inaccurate stops the command, naming the
    largest c that is not. Each ``--compression`` adds a row of that codec over the ring: its
    wire simulated plus its compute at the rate measured here, and its error on one step of
    Gaussian gradients.
    """
    codecs = _codecs(codecs)
    topo = _topology(topology, workers)
    n = len(topo.workers)
    elements = _elements(size, dtype)
    nbytes = elements * dtypes.itemsize(dtype)
    chosen = _affordable(_chosen(names, dtype), names, n)
    step, rows = _steps(len(chosen), "compare"), []
    for name in chosen:
        step(f"{name} on {n} workers")
        row = _compare_row(name, topo, n, elements, dtype, components, names)
        if row is not None:
            rows.append(row)
    for row in _codec_rows(codecs, topo, n, elements):
        row.update(closed_form_s=None, busiest_link="-", busiest_link_bytes=row["bytes"])
        row["algbw_GBps"], row["busbw_GBps"] = _bandwidths_GBps(nbytes, row["time_s"], n)
        rows.append(row)
    step(None)
    _emit(fmt, rows, lambda rows: _render_compare(rows, topo, n, nbytes, dtype, codecs))


def _simulated_schedule(algorithm, n, elements, dtype, options, trace_path, out):
    """The compact form where the algorithm has one and nothing asks for every transfer (a trace,
    a JSON timeline), else the table (refused beyond TABLE_WORKERS, saying what that costs)."""
    compact, every = _compact.build(algorithm, n, elements, **options), trace_path or (out and not out.endswith(".npz"))
    if compact is not None and every and compact.transfer_count > EXPAND_ON_LOAD:
        raise click.BadParameter(f"a trace or a JSON timeline lists every transfer, {compact.transfer_count:,} here; "
                                 "write an .npz timeline (--out run.npz) instead", param_hint="'--out'")
    if compact is None and n > TABLE_WORKERS[0]:
        raise click.BadParameter(f"expected 2..{TABLE_WORKERS[0]} workers for {algorithm}, got {n}: "
                                 + TABLE_WORKERS[1].format(algorithm=algorithm), param_hint="'--workers'")
    return (compact.expand() if every else compact) if compact is not None else \
        algorithms.build(algorithm, n, elements, dtype=dtype, **options)


def _reporter(n):
    """simulate's ``progress``: before an event loop estimated over 2 s, the estimate (time, memory),
    then every 5 s the share delivered, on stderr: ``_reporter(4)("flows", 10)``."""
    state = {"last": time.monotonic(), "loud": False}

    def report(stage, value):
        now = time.monotonic()
        if stage in COST_PER:
            seconds, memory = value * COST_PER[stage][0], value * COST_PER[stage][1] + n * BYTES_PER_WORKER
            state.update(last=now, loud=seconds > 2)
            if state["loud"]:
                click.echo(f"simulating {value:,} {stage}: about {format_time(seconds)} and {format_size(memory)} "
                           f"(estimated)", err=True)
        elif state["loud"] and now - state["last"] > 5:
            state["last"] = click.echo(f"  {value:.0%} of the flows delivered", err=True) or now
    return report


def _save_simulation(result, out, trace_path):
    """Write the timeline to ``out`` (.npz, else JSON) and the Chrome trace to ``trace_path``, as asked."""
    if out:
        try:
            if out.endswith(".npz"):
                result.save(out)
            else:
                with open(out, "w") as fh:
                    json.dump(result.to_dict(timeline=True), fh)
        except OSError as exc:
            raise click.BadParameter(f"cannot write {out!r}: {exc.strerror}", param_hint="'--out'")
    if trace_path:
        from ..tools.trace_files import from_simulation
        _write_json(from_simulation(result), trace_path, "--trace")


@main.command("simulate")
@click.option("--algorithm", "-a", required=True, help="An algorithm (see 'gradsync list').")
@topology_option
@click.option("--size", "-s", type=Size(), default="160MB", show_default=True)
@workers_option
@dtype_option
@click.option("--option", "-o", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="Algorithm option, e.g. -o segments=16 (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the result with its timeline of transfers: .npz (numpy columns, compact and fast "
                   "for millions of transfers) or JSON (any other name).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace (ui.perfetto.dev): a track per worker, a utilisation counter per busy link.")
@format_option
def simulate_cmd(algorithm, topology, size, workers, dtype, option_pairs, out, trace_path, fmt):
    """Simulate one all-reduce on a topology; optionally write its timeline (.npz or JSON) or a trace."""
    for path, option in ((out, "--out"), (trace_path, "--trace")):
        if path:
            _writable(path, option)
    topo = _topology(topology, workers, COMPACT_WORKERS)
    n = len(topo.workers)
    elements = _elements(size, dtype)
    _affordable([algorithm], algorithm, n, hint="'--algorithm'")
    options = {**default_options(algorithm, topo, n), **_parse_options(option_pairs)}
    schedule = _simulated_schedule(algorithm, n, elements, dtype, options, trace_path, out)
    if trace_path:
        from ..tools.trace_files import check_size
        check_size(schedule)          # before a long simulation
    result = simulate(schedule, topo, dtypes.itemsize(dtype), progress=_reporter(n))
    summary = {**result.to_dict(timeline=False), **({"classes_s": list(result.classes)} if result.classes else {})}
    summary["links"] = sorted(summary["links"], key=lambda l: -l["bytes"])[:10]
    _save_simulation(result, out, trace_path)

    def render(s):
        click.echo(f"{algorithm} on {topo.name}, {n} workers, {format_size(s['bytes'])}: "
                   f"{format_time(s['time_s'])} in {s['rounds']} rounds")
        if "classes_s" in s:
            click.echo(f"chunks of unequal sizes: {format_time(s['classes_s'][1])} with every chunk at its largest, "
                       f"{format_time(s['classes_s'][0])} at its smallest (docs/simulator.md: how near the exact time)")
        _print_table(["busiest links", "bytes", "busy"],
                     [[l["channel"], format_size(l["bytes"]), format_time(l["busy_s"])] for l in s["links"][:5]])
        for path, what in ((out, "timeline written to {}"), (trace_path, "trace written to {} (open it in ui.perfetto.dev)")):
            if path:
                click.echo(what.format(path))

    _emit(fmt, summary, render)


def _render_tune(o, rows, topo, plot):
    click.echo(f"{topo.name}: {topo.description or f'{len(topo.links)} links'}; {o['workers']} workers")
    names = list(rows[0]["times_s"])
    short = {a: a.replace("(components=", " c=").replace("(", " ").replace(")", "") for a in names}
    _print_table(["size", "best"] + [short[a] for a in names],
                 [[format_size(r["bytes"]), short[r["best"]]] + [format_time(r["times_s"][a]) for a in names]
                  for r in rows])
    for c in o["crossovers"]:
        click.echo(f"crossover at {format_size(c['bytes'])}: {c['below']} below, {c['above']} above")
    for name, error in o["codec_errors"].items():
        click.echo(f"{name}: relative error {error:.2g} on one step of Gaussian gradients")
    if plot:
        click.echo(f"plot written to {plot}")


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
    """Print the fastest algorithm per message size and the sizes where the choice changes.

    Each ``--compression`` adds a column for that codec over the ring (wire simulated, compute
    at the rate measured here), which can be the best; crossovers are among the uncompressed.
    """
    _png(plot)
    codecs = _codecs(codecs)
    topo = _tuned_topology(topology, workers, max_error)
    _elements(min_size, dtype, "--min-size")
    _elements(max_size, dtype, "--max-size")
    if not 0 < min_size <= max_size:
        raise click.BadParameter(f"need 0 < --min-size <= --max-size, got {min_size} and {max_size}")
    itemsize = dtypes.itemsize(dtype)
    sizes = np.unique(np.geomspace(max(min_size, itemsize), max_size,
                                   int(np.log2(max_size / max(min_size, itemsize))) // 2 + 2).astype(np.int64))
    rows, crossovers = table(topo, sizes, itemsize, max_error=max_error,
                             dtype=dtype if dtype in ("float32", "float64") else "float32")
    errors = {}
    for r in rows:
        for c in _codec_rows(codecs, topo, len(topo.workers), max(1, r["bytes"] // itemsize)):
            r["times_s"][c["algorithm"]] = c["time_s"]
            errors[c["algorithm"]] = c["error"]
        r["best"] = min(r["times_s"], key=r["times_s"].get)
    out = {"topology": topo.name, "workers": len(topo.workers), "rows": rows, "codec_errors": errors,
           "crossovers": [{"bytes": c.nbytes, "below": c.below, "above": c.above} for c in crossovers]}
    if plot:
        from ..tools.plots import tune_plot
        tune_plot(rows, out["crossovers"], plot, f"{topo.name}, {len(topo.workers)} workers, {dtype}: predicted time")
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
    headers = ["candidate", "predicted", "latency", "bandwidth", "reduction", "codec", "bottleneck link"]
    if measured:
        headers.append("measured")
    lines = []
    for r in sorted(o["candidates"], key=lambda r: r["predicted_s"]):
        line = [r["candidate"], format_time(r["predicted_s"])] + \
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
    click.echo(f"predicted: the {best['predicted_by']}'s time, as tune compares; the terms split the closed form, "
               f"which matches the simulator where every pair of workers meets through one switch (there auto "
               f"uses it)")


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
