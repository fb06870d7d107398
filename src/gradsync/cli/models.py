"""The commands that ask the models of time, running nothing: compare and simulate (tune and
explain, which choose: ``choice.py``).

>>> _parse_options(["segments=16", "construction=unity"])
{'segments': 16, 'construction': 'unity'}
"""

from __future__ import annotations

import json
import time

import click

from . import common
from .common import (Size, _affordable, _chosen, _codecs, _elements, _emit, _print_table, _steps, _topology,
                     _writable, _write_json, compression_option, dtype_option, format_option, main,
                     topology_option, workers_option)
from .. import algorithms, dtypes
from ..algorithms import _compact
from ..errors import ConfigError
from ..model.cost import default_options, net_for, predict, uniform
from ..model.simulate import simulate
from ..model.simulate.result import EXPAND_ON_LOAD
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
COMPARE_TABLE = 1 << 18      # transfers: a larger table (NCCL's tree on hundreds of GPUs) is compared by its closed form


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
    """compare's row for algorithm ``name``: simulated (or, where simulating is unaffordable, the
    closed form's: ``predicted_by``) and closed-form time, busiest link, algbw and busbw, error, on
    a GPU machine its fastest protocol; None for CERAR's default design refused in this dtype
    when not asked for."""
    itemsize = dtypes.itemsize(dtype)
    nbytes = elements * itemsize
    options = default_options(name, topo, n)
    if "components" in algorithms.get(name).options:
        options["components"] = components
    try:
        schedule = (_compact.build(name, n, elements, **options) if elements >= n else None) or \
            algorithms.build(name, n, elements, dtype=dtype, **options)         # CERAR: its best design
    except ConfigError:
        if names is not None or components is not None or algorithms.get(name).exact:
            raise
        return None         # not asked for: CERAR's default design refused in float16, as it is for int32
    affordable = getattr(schedule, "transfer_count", None) is not None or len(schedule.transfers) <= COMPARE_TABLE
    protocol, result = _fastest_protocol(schedule, topo, itemsize) if affordable else (None, None)
    closed = {k: v for k, v in options.items() if k not in ("construction",)}
    if result is None:           # a table too large to simulate here: the closed form, said so
        protocol = topo.gpu.default if topo.gpu else None
        seconds, how, link, link_bytes = predict(name, topo, n, nbytes, itemsize, protocol, **closed), \
            "closed form", "-", 0.0
    else:
        seconds, how, (link, link_bytes) = result.time, "simulator", result.busiest_channel()
    algbw, busbw = _bandwidths_GBps(nbytes, seconds, n)
    row = {"algorithm": name, "time_s": seconds, "predicted_by": how, "protocol": protocol,
           "closed_form_s": predict(name, topo, n, nbytes, itemsize, protocol, **closed),
           "busiest_link": link, "busiest_link_bytes": link_bytes,
           "algbw_GBps": algbw, "busbw_GBps": busbw,
           "error": _predicted_error(schedule, dtype)}
    if "components" in schedule.options:
        row["components"] = schedule.options["components"]
    if name == "ring":
        net = net_for(topo, n, options)
        bandwidth = sum(1 / b for b in net.ring_betas) if net.ring_betas else 1 / net.beta
        row["approx_2n_over_B_s"] = 2 * nbytes / bandwidth
        row["approx_bandwidth_Bps"] = bandwidth
    return row


def _fastest_protocol(schedule, topo, itemsize):
    """On a GPU machine the protocol (of those it offers; NVLS, NVLS-tree and PAT take Simple
    alone, as NCCL runs them) with the least simulated time, and that simulation; elsewhere
    (None, the simulation)."""
    from ..model.tune import SIMPLE_ONLY
    if topo.gpu is None:
        return None, simulate(schedule, topo, itemsize)
    offered = ("simple",) if schedule.algorithm in SIMPLE_ONLY else topo.gpu.protocols
    results = {p: simulate(schedule, topo, itemsize, protocol=p) for p in offered}
    best = min(results, key=lambda p: results[p].time)
    return best, results[best]


def _runnable_only(chosen, names, topo, n, notes: list | None = None):
    """``chosen`` less the algorithms the topology cannot run, named once on stderr, or added to
    ``notes`` for the caller to print once its own checks have passed (an error stays one line);
    one line and exit code 2 when the user named one of them."""
    from ..model.tune import skipped
    gone = skipped(topo, n, chosen)
    if gone and names is not None:
        raise click.BadParameter(next(iter(gone.values())), param_hint="'--algorithms'")
    if gone:
        note = "gradsync: note: left out, as this topology cannot run them: " + "; ".join(gone.values())
        if notes is None:
            click.echo(note, err=True)
        else:
            notes.append(note)
    return [a for a in chosen if a not in gone]


def _render_compare(rows, topo, n, nbytes, dtype, codecs):
    click.echo(f"{topo.name}: {topo.description or f'{len(topo.links)} links'}; {n} workers, {format_size(nbytes)} {dtype}")
    gpu = topo.gpu is not None
    _print_table(["algorithm"] + (["protocol"] if gpu else []) + ["simulated", "closed form", "busiest link",
                                                                 "bytes on it", "algbw", "busbw", "error"],
                 [[r["algorithm"] + (f" c={r['components']}" if "components" in r else "")]
                  + ([r.get("protocol") or "-"] if gpu else [])
                  + [format_time(r["time_s"]) + ("*" if r.get("predicted_by") == "closed form" else ""),
                   format_time(r["closed_form_s"]) if r["closed_form_s"] is not None else "-",
                   r["busiest_link"], format_size(r["busiest_link_bytes"]), f"{r['algbw_GBps']:.3g} GB/s",
                   f"{r['busbw_GBps']:.3g} GB/s", f"{r['error']:.2g}" if r["error"] else "exact"]
                  for r in rows])
    if codecs:
        click.echo("codec rows (+): simulated wire plus the codec's compute measured here; for them 'bytes on it' "
                   "is the most one worker sends, and the error is one step's on Gaussian gradients")
    if any(r.get("predicted_by") == "closed form" for r in rows):
        click.echo(f"*: the closed form's time: a table of more than {COMPARE_TABLE:,} transfers is not simulated here")
    if gpu:
        click.echo("protocol: the NCCL protocol each algorithm is fastest with here (LL, LL128, Simple: their "
                   "bytes on the wire and latency per step, docs/validation.md)")
        for note in topo.gpu.notes:
            click.echo(f"note: {note}")
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
    notes = []
    chosen = _runnable_only(_affordable(_chosen(names, dtype), names, n), names, topo, n, notes)
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
    for note in notes:
        click.echo(note, err=True)


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
@click.option("--protocol", type=click.Choice(["ll", "ll128", "simple"]), default=None,
              help="On a GPU machine, the NCCL protocol the transfers move by (default: Simple).")
@format_option
def simulate_cmd(algorithm, topology, size, workers, dtype, option_pairs, out, trace_path, protocol, fmt):
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
    result = simulate(schedule, topo, dtypes.itemsize(dtype), progress=_reporter(n), protocol=protocol)
    summary = {**result.to_dict(timeline=False), **({"classes_s": list(result.classes)} if result.classes else {})}
    summary["links"] = sorted(summary["links"], key=lambda l: -l["bytes"])[:10]
    _save_simulation(result, out, trace_path)

    def render(s):
        click.echo(f"{algorithm} on {topo.name}, {n} workers, {format_size(s['bytes'])}: "
                   f"{format_time(s['time_s'])} in {s['rounds']} rounds"
                   + (f", protocol {s['protocol']}" if s.get("protocol") else ""))
        for note in topo.gpu.notes if topo.gpu else ():
            click.echo(f"note: {note}")
        if "classes_s" in s:
            click.echo(f"chunks of unequal sizes: {format_time(s['classes_s'][1])} with every chunk at its largest, "
                       f"{format_time(s['classes_s'][0])} at its smallest (docs/simulator.md: how near the exact time)")
        _print_table(["busiest links", "bytes", "busy"],
                     [[l["channel"], format_size(l["bytes"]), format_time(l["busy_s"])] for l in s["links"][:5]])
        for path, what in ((out, "timeline written to {}"), (trace_path, "trace written to {} (open it in ui.perfetto.dev)")):
            if path:
                click.echo(what.format(path))

    _emit(fmt, summary, render)
