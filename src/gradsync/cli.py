"""The ``gradsync`` command line. Bad input: one line on stderr and exit code 2."""

from __future__ import annotations

import json
import os
import sys

import click
import numpy as np

from . import algorithms
from .model.cost import default_options, net_for, predict, uniform
from .errors import ConfigError, GradsyncError
from .model.simulate import simulate
from .model.topology import PRESETS, resolve
from .model.tune import table
from .units import format_size, format_time, parse_bandwidth, parse_size

_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}


class Cli(click.Group):
    """A click group whose errors are one line and exit code 2, never a traceback."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS_IS_HELP as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
            sys.exit(2)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("gradsync: aborted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            click.echo(f"gradsync: error: {exc.format_message()}", err=True)
            sys.exit(2)
        except GradsyncError as exc:
            click.echo(f"gradsync: error: {exc}", err=True)
            sys.exit(2)


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        try:
            return parse_size(value)
        except GradsyncError as exc:
            self.fail(str(exc), param, ctx)


# Limits, stated up front so that a command refuses at once instead of running for minutes.
MAX_BYTES = 10**12            # 1 TB: beyond any gradient, far inside the schedules' int64 offsets
SIMULATED = (1024, "a ring of N workers is 2N(N-1) transfers: at 1024 workers compare takes about 80 s and "
                   "1.1 GB, and one ring of 4096 took 149 s and 6.7 GB")
TUNED = (4096, "above 64 workers the tuner uses closed forms: 4096 workers take about 7 s, 65536 took 194 s and 8 GB")
CERAR_WORKERS = (64, "choosing its design takes about 0.2 s at 64 workers and c = 128, 2.4 s at c = 256, "
                      "and grows quickly beyond")
CERAR_TUNED = (32, "each size designs 5 CERAR codes: 32 workers take about 36 s, 64 took 182 s")
MAX_COMPONENTS = 256          # CERAR designs beyond take minutes


def _topology(name, workers, limit=None):
    """Resolve a topology of 2 to ``limit[0]`` workers (default SIMULATED); else one line naming the count and why."""
    most, why = limit or SIMULATED
    if workers is not None and not 2 <= workers <= most:
        raise click.BadParameter(f"expected 2..{most} workers, got {workers}: "
                                 + ("an all-reduce needs at least 2" if workers < 2 else why), param_hint="'--workers'")
    topo = resolve(name, workers)
    n = len(topo.workers)
    if not 2 <= n <= most:
        raise click.BadParameter(f"topology {name!r} has {n} worker(s), expected 2..{most}: "
                                 + ("an all-reduce needs at least 2" if n < 2 else why), param_hint="'--topology'")
    return topo


def _elements(nbytes, dtype, option="--size", most=MAX_BYTES) -> int:
    """The whole number of ``dtype`` elements in ``nbytes``; one line naming the size unless it is one
    element to ``most`` bytes and a multiple of the element size: ``_elements(4000, "float32") == 1000``."""
    itemsize = DTYPES[dtype]
    if not itemsize <= nbytes <= most or nbytes % itemsize:
        got = f"{nbytes} B" if nbytes < 10**15 else format_size(nbytes)
        raise click.BadParameter(f"expected a whole number of {dtype} elements ({itemsize} B each) from "
                                 f"{itemsize} B to {format_size(most)}, got {got}", param_hint=f"'{option}'")
    return nbytes // itemsize


def _writable(path, option):
    """Refuse, before any long work, an output path that cannot be written: ``_writable("c.json", "--out")``."""
    folder = os.path.dirname(os.path.abspath(path))
    problem = ("it is a directory" if os.path.isdir(path) else
               f"no directory {folder!r}" if not os.path.isdir(folder) else
               f"directory {folder!r} is not writable" if not os.access(folder, os.W_OK) else
               "the file is not writable" if os.path.exists(path) and not os.access(path, os.W_OK) else None)
    if problem:
        raise click.BadParameter(f"cannot write {path!r}: {problem}", param_hint=f"'{option}'")


def _affordable(chosen, names, workers, hint="'--algorithms'"):
    """``chosen`` without CERAR above CERAR_WORKERS: a note when it came from the default list,
    a one-line refusal when named (``names`` not None)."""
    most, why = CERAR_WORKERS
    if "cerar" not in chosen or workers <= most:
        return chosen
    message = f"takes at most {most} workers, got {workers}: {why}"
    if names is not None:
        raise click.BadParameter(f"cerar {message}", param_hint=hint)
    click.echo(f"gradsync: note: cerar left out: it {message}", err=True)
    return [a for a in chosen if a != "cerar"]


def _steps(total, label):
    """A progress bar on stderr when it is a terminal, else a no-op: ``step = _steps(3, "compare")``."""
    if not sys.stderr.isatty():
        return lambda description: None
    from .tools.progress_bar import bar
    return bar(total, label)


OPTION_LIMITS = {"components": MAX_COMPONENTS, "segments": 4096}   # larger ones take minutes to build


def _write_json(data, path, option):
    """Write ``data`` as JSON; one line naming ``option`` if the file cannot be written."""
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path!r}: {exc.strerror}", param_hint=f"'{option}'")


def _parse_options(pairs) -> dict:
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
    if schedule.codec is None:
        return 0.0
    from .coding import cerar
    return cerar.Design.from_dict(schedule.codec).predicted_error(dtype if dtype in cerar.UNIT_ROUNDOFF else "float32")


def _chosen(names, dtype) -> list[str]:
    """The algorithms of a comma-separated ``--algorithms`` list, each checked against the
    registry and the dtype; when none is given, every registered one that takes the dtype."""
    if names is None:
        return [a for a in algorithms.names() if algorithms.get(a).accepts(dtype)]
    chosen = [a.strip() for a in names.split(",") if a.strip()]
    if not chosen:
        raise click.BadParameter(f"expected comma-separated algorithm names, got {names!r}",
                                 param_hint="'--algorithms'")
    for a in chosen:
        algorithms.get(a).check_dtype(dtype)
    return chosen


def _emit(fmt, rows, render):
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        render(rows)


def _print_table(headers, rows):
    from rich.console import Console
    from rich.table import Column, Table

    t = Table(*(Column(h, overflow="fold") for h in headers), box=None, header_style="bold", pad_edge=False)
    for row in rows:
        t.add_row(*map(str, row))
    Console(width=160).print(t)


topology_option = click.option("--topology", "-t", default="pcie-switch-4", show_default=True,
                               help=f"A preset ({', '.join(PRESETS)}) or a .toml/.json/.yaml file.")
workers_option = click.option("--workers", "-n", type=int, default=None,
                              help="Workers (sizes the ethernet preset; else the first N devices).")
dtype_option = click.option("--dtype", type=click.Choice(list(DTYPES)), default="float32", show_default=True)
format_option = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)
compression_option = click.option(
    "--compression", "-z", "codecs", multiple=True, metavar="CODEC",
    help="Also a compressed exchange, e.g. fp16, bf16, powersgd:rank=4, topk:ratio=0.01, sign (repeatable).")


def _codecs(codecs) -> list[str]:
    """The ``--compression`` values, each checked (a bad one is one line, exit code 2)."""
    from .compression import make
    return [make(c).label for c in codecs]


def _codec_rows(codecs, topo, n, elements, over="ring") -> list[dict]:
    """Predicted time (simulated wire plus measured codec compute) and one-step error of each
    codec over the ``over`` schedule, for compare and tune."""
    from .tools.codec_predict import one_step_error, predict as predict_codec
    rows = []
    for c in codecs:
        p = predict_codec(c, over, topo, elements, n, default_options(over, topo, n))
        rows.append({"algorithm": f"{over}+{c}", "compression": c, **p, "error": one_step_error(c, n)})
    return rows


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gradsync")
def main():
    """gradsync: gradient synchronization strategies, simulated, costed and compared."""


@main.command()
@topology_option
@click.option("--size", "-s", type=Size(), default="160MB", show_default=True, help="Gradient size, e.g. 160MB.")
@workers_option
@dtype_option
@click.option("--algorithms", "names", default=None,
              help="Comma-separated algorithms to compare (default: every one that takes the dtype; "
                   "see 'gradsync list').")
@click.option("--components", "-c", type=click.IntRange(1, MAX_COMPONENTS), default=None,
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
    itemsize, n = DTYPES[dtype], len(topo.workers)
    elements = _elements(size, dtype)
    nbytes = elements * itemsize
    chosen = _affordable(_chosen(names, dtype), names, n)
    step, rows = _steps(len(chosen), "compare"), []
    for name in chosen:
        step(f"{name} on {n} workers")
        options = default_options(name, topo, n)
        if "components" in algorithms.get(name).options:
            options["components"] = components
        try:
            schedule = algorithms.build(name, n, elements, dtype=dtype, **options)   # CERAR: its best design
        except ConfigError:
            if names is not None or components is not None or algorithms.get(name).exact:
                raise
            continue        # not asked for: CERAR's default design refused in float16, as it is for int32
        result = simulate(schedule, topo, itemsize)
        link, link_bytes = result.busiest_channel()
        options = {k: v for k, v in options.items() if k not in ("construction",)}
        algbw = nbytes / result.time if result.time > 0 else float("inf")
        row = {"algorithm": name, "time_s": result.time,
               "closed_form_s": predict(name, topo, n, nbytes, itemsize, **options),
               "busiest_link": link, "busiest_link_bytes": link_bytes,
               "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * 2 * (n - 1) / n / 1e9,
               "error": _predicted_error(schedule, dtype)}
        if "components" in schedule.options:
            row["components"] = schedule.options["components"]
        if name == "ring":
            net = net_for(topo, n, options)
            bandwidth = sum(1 / b for b in net.ring_betas) if net.ring_betas else 1 / net.beta
            row["approx_2n_over_B_s"] = 2 * nbytes / bandwidth
            row["approx_bandwidth_Bps"] = bandwidth
        rows.append(row)
    for row in _codec_rows(codecs, topo, n, elements):
        row.update(closed_form_s=None, busiest_link="-", busiest_link_bytes=row["bytes"])
        row["algbw_GBps"] = nbytes / row["time_s"] / 1e9 if row["time_s"] > 0 else float("inf")
        row["busbw_GBps"] = row["algbw_GBps"] * 2 * (n - 1) / n
        rows.append(row)
    step(None)

    def render(rows):
        click.echo(f"{topo.name}: {topo.description}; {n} workers, {format_size(nbytes)} {dtype}")
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

    _emit(fmt, rows, render)


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
    if out:
        _writable(out, "--out")
    if trace_path:
        _writable(trace_path, "--trace")
    topo = _topology(topology, workers)
    itemsize, n = DTYPES[dtype], len(topo.workers)
    elements = _elements(size, dtype)
    _affordable([algorithm], algorithm, n, hint="'--algorithm'")
    options = {**default_options(algorithm, topo, n), **_parse_options(option_pairs)}
    step = _steps(1, "simulate")
    step(f"{algorithm} on {n} workers")
    schedule = algorithms.build(algorithm, n, elements, dtype=dtype, **options)
    if trace_path:
        from .tools.trace_files import check_size
        check_size(schedule)          # before a long simulation
    result = simulate(schedule, topo, itemsize)
    step(None)
    summary = result.to_dict(timeline=False)
    summary["links"] = sorted(summary["links"], key=lambda l: -l["bytes"])[:10]
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
        from .tools.trace_files import from_simulation
        _write_json(from_simulation(result), trace_path, "--trace")

    def render(s):
        click.echo(f"{algorithm} on {topo.name}, {n} workers, {format_size(s['bytes'])}: "
                   f"{format_time(s['time_s'])} in {s['rounds']} rounds")
        _print_table(["busiest links", "bytes", "busy"],
                     [[l["channel"], format_size(l["bytes"]), format_time(l["busy_s"])] for l in s["links"][:5]])
        if out:
            click.echo(f"timeline written to {out}")
        if trace_path:
            click.echo(f"trace written to {trace_path} (open it in ui.perfetto.dev)")

    _emit(fmt, summary, render)


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
    topo = _topology(topology, workers, TUNED)
    if max_error is not None and len(topo.workers) > CERAR_TUNED[0]:
        raise click.BadParameter(f"takes at most {CERAR_TUNED[0]} workers, got {len(topo.workers)}: {CERAR_TUNED[1]}",
                                 param_hint="'--max-error'")
    _elements(min_size, dtype, "--min-size")
    _elements(max_size, dtype, "--max-size")
    if not 0 < min_size <= max_size:
        raise click.BadParameter(f"need 0 < --min-size <= --max-size, got {min_size} and {max_size}")
    itemsize = DTYPES[dtype]
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
        from .tools.plots import tune_plot
        tune_plot(rows, out["crossovers"], plot, f"{topo.name}, {len(topo.workers)} workers, {dtype}: predicted time")

    def render(o):
        click.echo(f"{topo.name}: {topo.description}; {o['workers']} workers")
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

    _emit(fmt, out, render)


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
    from .model.explain import explain

    topo = _topology(topology, workers, TUNED)
    if max_error is not None and len(topo.workers) > CERAR_TUNED[0]:
        raise click.BadParameter(f"takes at most {CERAR_TUNED[0]} workers, got {len(topo.workers)}: {CERAR_TUNED[1]}",
                                 param_hint="'--max-error'")
    n, itemsize = len(topo.workers), DTYPES[dtype]
    elements = _elements(size, dtype)
    rows = _bench_rows(measured) if measured else None
    candidates = _affordable(_chosen(names, dtype), names, n) if names is not None else None
    out = explain(topo, elements * itemsize, itemsize, n, candidates, max_error,
                  dtype if dtype in ("float32", "float64") else "float32", rows)

    def render(o):
        click.echo(f"{topo.name}: {topo.description}; {n} workers, {format_size(o['bytes'])} {dtype}")
        headers = ["candidate", "predicted", "latency", "bandwidth", "reduction", "codec", "bottleneck link"]
        if rows is not None:
            headers.append("measured")
        table = []
        for r in sorted(o["candidates"], key=lambda r: r["predicted_s"]):
            line = [r["candidate"], format_time(r["predicted_s"])] + \
                [format_time(r[k]) for k in ("latency", "bandwidth", "reduction", "codec")] + \
                [f"{r['bottleneck']} ({r['bottleneck_busy']:.0%} busy)" if r["bottleneck"] else "-"]
            if rows is not None:
                line.append("-" if r["measured_s"] is None else format_time(r["measured_s"]))
            table.append(line)
        _print_table(headers, table)
        best = next(r for r in o["candidates"] if r["candidate"] == o["winner"])
        click.echo(f"winner: {o['winner']}" + (f"; the next best, {o['runner_up']}, is predicted {o['margin']:.1%} slower"
                                              if o["margin"] is not None else "")
                   + f"; its time is mostly {o['winner_dominant_term']} "
                     f"({best[o['winner_dominant_term']] / (best['closed_form'] or 1):.0%} of its closed form)")
        click.echo(f"predicted: the {best['predicted_by']}'s time, as tune compares; the terms split the closed form, "
                   f"which matches the simulator where every pair of workers meets through one switch (there auto "
                   f"uses it)")

    _emit(fmt, out, render)


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


def _png(path, option="--plot"):
    """Refuse, before any work, a plot path that is not a writable .png: ``_png("a.png")``."""
    if path is None:
        return
    if not path.endswith(".png"):
        raise click.BadParameter(f"must end in .png, got {path!r}", param_hint=f"'{option}'")
    _writable(path, option)


def _ladder(lo, hi):
    """Round sizes from ``lo`` up to exactly ``hi``, about 4x apart: powers of 4 below ``hi`` when
    it is a power of two (4 KiB, 16 KiB, ...), else 1, 4, 16, 64, 250 times 1000^k.

    >>> _ladder(4000, 16_000_000)
    [4000, 16000, 64000, 250000, 1000000, 4000000, 16000000]
    """
    if hi & (hi - 1) == 0:
        steps = [hi >> 2 * k for k in range(1, hi.bit_length() // 2 + 1)]
    else:
        steps = [m * 1000**k for k in range(5) for m in (1, 4, 16, 64, 250)]
    return sorted({n for n in steps if lo <= n <= hi // 2} | {hi})


def _sizes(sizes, min_size, max_size, dtype, most=4 << 30):
    """Bench sizes in bytes, each a whole number of ``dtype`` elements: the ``--sizes`` list, or
    round sizes from ``--min-size`` up to exactly ``--max-size``. ``_sizes("4KB", None, None, "float32")``."""
    if sizes is not None:
        out = [parse_size(x) for x in sizes.split(",") if x.strip()]
        if not out:
            raise click.BadParameter(f"expected comma-separated sizes like 4KB,1MB, got {sizes!r}", param_hint="'--sizes'")
        for n in out:
            _elements(n, dtype, "--sizes", most)
        return out
    _elements(min_size, dtype, "--min-size", most)
    _elements(max_size, dtype, "--max-size", most)
    if not min_size <= max_size:
        raise click.BadParameter(f"need 0 < --min-size <= --max-size, got {min_size} and {max_size}")
    return [n for n in _ladder(min_size, max_size) if n % DTYPES[dtype] == 0]


@main.command()
@click.option("--workers", "-n", type=click.IntRange(2, 64), default=4, show_default=True,
              help="Local worker processes (Gloo over 127.0.0.1).")
@click.option("--algorithms", "names", default=None,
              help="Comma-separated algorithms (default: every one that takes the dtype; see 'gradsync list'); "
                   "the engine's own all-reduce runs as 'native'.")
@click.option("--sizes", default=None, help="Comma-separated message sizes (e.g. 4KB,1MB,64MB).")
@click.option("--min-size", type=Size(), default="4KB", show_default=True)
@click.option("--max-size", type=Size(), default="256MB", show_default=True)
@click.option("--iters", type=click.IntRange(1, 10000), default=None, help="Timed iterations per row (default by size).")
@click.option("--dtype", type=click.Choice(["float32", "float64", "bfloat16", "int32"]), default="float32",
              show_default=True)
@click.option("--components", "-c", type=click.IntRange(min=1), default=None,
              help="Components, for the algorithms that take them (CERAR; default 2N).")
@click.option("--backend", type=click.Choice(["torch", "mpi"]), default="torch", show_default=True)
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --backend mpi: Open MPI's hostfile, to start the ranks on several machines.")
@click.option("--transport", type=click.Choice(["gloo", "mpi", "shm", "auto"]), default="gloo", show_default=True,
              help="What gradsync's rows run over: Gloo point-to-point, MPI (as --backend mpi), shared memory "
                   "(local workers), or auto (shared memory when the workers share a host).")
@click.option("--timeout", type=click.FloatRange(0, 1e6, min_open=True), default=60.0, show_default=True,
              help="Seconds before a stalled collective raises PeerError.")
@click.option("--topology", "-t", default=None,
              help="A topology (e.g. from 'gradsync calibrate') to print the simulator's prediction beside each row.")
@click.option("--link-bandwidth", default=None,
              help="Emulate slow links (e.g. 100Mbit): each worker in its own network namespace (root).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace of every gradsync collective (ui.perfetto.dev): a track per rank, "
                   "slices per collective, round and transfer, clocks aligned.")
@click.option("--flight-dir", type=click.Path(file_okay=False), default=None,
              help="Where each rank writes its flight record on a failure or SIGUSR1 (read it with 'gradsync doctor').")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw busbw against size per algorithm (native included) to this PNG.")
@click.option("--compression", "-z", "codec", default=None, metavar="CODEC",
              help="Compress for every algorithm: fp16, bf16, powersgd:rank=4, topk:ratio=0.01 or sign "
                   "(the native row stays uncompressed).")
@format_option
def bench(workers, names, sizes, min_size, max_size, iters, dtype, components, backend, hostfile, transport, timeout,
          topology, link_bandwidth, trace_path, flight_dir, plot, codec, fmt):
    """Time all-reduce between local worker processes, per algorithm and size, like nccl-tests."""
    from .tools import bench as bench_mod
    from .tools.launch import run

    _png(plot)
    if hostfile and backend != "mpi" and transport != "mpi":
        raise click.BadParameter("a hostfile is for --backend mpi (torchrun and srun place ranks themselves)",
                                 param_hint="'--hostfile'")
    if transport == "mpi":
        backend = "mpi"
    elif backend == "mpi" and transport != "gloo":
        raise click.BadParameter(f"--transport {transport} runs on the torch backend, not mpi",
                                 param_hint="'--transport'")
    if link_bandwidth and transport in ("shm", "auto"):
        raise click.BadParameter(f"--transport {transport} bypasses the emulated links: use gloo with "
                                 "--link-bandwidth", param_hint="'--transport'")
    if trace_path:
        _writable(trace_path, "--trace")
        if codec is not None:
            raise click.BadParameter("traces do not record compressed all-reduces yet", param_hint="'--trace'")
        if backend == "mpi" or "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
            raise click.BadParameter("traces are written for local workers on the torch backend, not under "
                                     "mpirun or torchrun", param_hint="'--trace'")
    # the default list over Gloo also shows shared memory where the ranks share a host
    engine = bench_mod.TorchEngine(transport, shared_rows=names is None and transport == "gloo" and codec is None
                                   and not (link_bandwidth or trace_path))

    chosen = _chosen(names, dtype)
    if flight_dir:                        # the workers inherit it
        os.environ["GRADSYNC_FLIGHT_DIR"] = os.path.abspath(flight_dir)
    options = {a: {"components": components} for a in chosen
               if components and "components" in algorithms.get(a).options}
    if codec is not None:
        codec = _codecs([codec])[0]
        if backend == "mpi" or dtype not in ("float32", "float64", "bfloat16"):
            raise click.BadParameter(f"needs --backend torch and a float dtype, got {backend} and {dtype}",
                                     param_hint="'--compression'")
        for a in chosen:
            options[a] = {**options.get(a, {}), "compression": codec}
    byte_sizes = _sizes(sizes, min_size, max_size, dtype)
    topo = _predictor(topology, chosen, options, dtype, workers)
    args = (byte_sizes, chosen, iters, dtype, timeout, options, fmt == "table" and sys.stderr.isatty())
    from .tools.launch import launched
    if backend == "mpi" and "OMPI_COMM_WORLD_RANK" in os.environ:     # inside an mpirun (or its allocation)
        if hostfile or link_bandwidth:
            raise click.UsageError("under mpirun, bench --backend mpi runs on mpirun's ranks: drop --hostfile "
                                   "and --link-bandwidth")
        engine = bench_mod.MpiEngine()
        workers = engine.comm.Get_size()
        rows = bench_mod.worker(engine.comm.Get_rank(), workers, *args, engine=engine)
        if rows is None:
            return                        # rank 0 reports
        where = f"{workers} MPI ranks started by mpirun"
    elif backend == "mpi":
        rows = _bench_mpi(workers, args, timeout, link_bandwidth, hostfile)
        where = f"{workers} MPI ranks (mpirun, hosts from {hostfile})" if hostfile else f"{workers} local MPI ranks (mpirun)"
    elif launched() is not None:          # started by torchrun (mpirun, srun): be one rank of that job
        from .tools.launch import as_launched
        rows, _, workers = as_launched(bench_mod.worker, *args, engine, timeout=timeout * 4 + 600)
        if rows is None:
            return
        where = f"{workers} ranks started by {launched()['launcher']}, Gloo"
    else:
        with _links(workers, link_bandwidth) as network:
            results = run(bench_mod.worker, workers, *args, engine, bool(trace_path), timeout=timeout * 4 + 600,
                          network=network)
        rows = results[0]
        if trace_path:
            from .tools.trace_files import merge
            rows = results[0]["rows"]
            _write_json(merge([r["trace"] for r in results]), trace_path, "--trace")
        where = (f"{workers} local workers on emulated {link_bandwidth} links (tc tbf)" if link_bandwidth
                 else f"{workers} local workers, Gloo over 127.0.0.1")
        used = {r["transport"] for r in rows if r["algorithm"] != bench_mod.NATIVE}
        if used == {"shm"}:
            where += "; gradsync's rows over shared memory"
        elif "shm" in used:
            where += "; ring also over shared memory"
        if link_bandwidth:
            limit = parse_bandwidth(link_bandwidth)
            for r in rows:
                r["link_limit_GBps"] = limit / 1e9
                r["busbw_of_limit"] = r["busbw_GBps"] * 1e9 / limit
    if topo is None and link_bandwidth and "RANK" not in os.environ:    # the emulated switch, as a topology
        from .model.topology import preset
        topo = preset("ethernet", workers=workers, nic=link_bandwidth, latency="50us")
    if topo is not None:
        for r in rows:
            name = "ring" if r["algorithm"] == bench_mod.NATIVE else r["algorithm"]
            opts = {**default_options(name, topo, workers), **options.get(name, {})}
            if opts.pop("compression", None) is not None and r["algorithm"] != bench_mod.NATIVE:
                from .tools.codec_predict import predict as predict_codec
                r["predicted_s"] = predict_codec(codec, name, topo, r["count"], workers, opts)["time_s"]
            else:
                sched = algorithms.build(name, workers, r["count"], dtype=dtype, **opts)
                r["predicted_s"] = simulate(sched, topo, DTYPES[dtype]).time
            r["prediction_error"] = r["predicted_s"] / r["time_s"] - 1 if r["time_s"] else 0.0
    if codec is not None:
        for r in rows:
            if r["algorithm"] != bench_mod.NATIVE:
                r["algorithm"], r["compression"] = f"{r['algorithm']}+{codec}", codec
    if plot:
        from .tools.plots import bench_plot
        bench_plot(rows, plot, f"gradsync bench: {where}, {dtype}")

    def render(rows):
        click.echo(f"gradsync bench: {where}, {dtype}; time = median over ranks' "
                   f"slowest; busbw = algbw x 2(N-1)/N")
        headers = ["size", "count", "algorithm", "transport", "time", "algbw", "busbw", "max error"]
        if topo is not None:
            headers += ["predicted", "pred. error"]
        table = []
        for r in rows:
            line = [format_size(r["bytes"]), r["count"], r["algorithm"], r["transport"], format_time(r["time_s"]),
                    f"{r['algbw_GBps']:.3f} GB/s", f"{r['busbw_GBps']:.3f} GB/s", f"{r['max_error']:.2g}"]
            if topo is not None:
                line += [format_time(r["predicted_s"]), f"{r['prediction_error']:+.0%}"]
            table.append(line)
        _print_table(headers, table)
        if trace_path:
            click.echo(f"trace written to {trace_path} (open it in ui.perfetto.dev)")
        if plot:
            click.echo(f"plot written to {plot}")

    _emit(fmt, rows, render)


def _predictor(topology, chosen, options, dtype, workers):
    """Bench's ``--topology``, resolved and placed for every algorithm before anything is launched."""
    if topology is None:
        return None
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:      # under torchrun, the group's size
        workers = int(os.environ["WORLD_SIZE"])
    topo = _topology(topology, workers)
    for name in chosen:                                       # refuses e.g. 'host' on a topology without one
        opts = {**default_options(name, topo, workers), **options.get(name, {})}
        opts.pop("compression", None)
        simulate(algorithms.build(name, workers, 0, dtype=dtype, **opts), topo, DTYPES[dtype])
    return topo


def _links(workers, bandwidth, latency=None):
    """Slow-link namespaces when asked for, else a context that changes nothing."""
    import contextlib

    if bandwidth is None and latency is None:
        return contextlib.nullcontext(None)
    from .tools.links import SlowLinks

    if bandwidth is None:
        raise click.BadParameter("--link-latency needs --link-bandwidth too", param_hint="'--link-latency'")
    parse_bandwidth(bandwidth)
    return SlowLinks(workers, bandwidth, latency)


def _bench_mpi(workers, args, timeout, link_bandwidth, hostfile=None):
    """Run the benchmark under mpirun (Open MPI), which starts its processes: local ones, or on
    the machines of ``hostfile`` (shared memory inside a machine, TCP across)."""
    import shutil
    import subprocess

    if link_bandwidth:
        raise click.BadParameter("slow links are emulated for the torch backend only", param_hint="'--backend'")
    if shutil.which("mpirun") is None:
        raise click.BadParameter("mpirun not found: install Open MPI (Debian: openmpi-bin) and mpi4py",
                                 param_hint="'--backend'")
    sizes, names, iters, dtype, _, options, _ = args
    payload = json.dumps({"sizes": sizes, "names": names, "iters": iters, "dtype": dtype, "timeout": timeout,
                          "options": options, "external": algorithms.external()})
    where = ["--hostfile", hostfile, "--mca", "btl", "self,vader,tcp"] if hostfile else ["--mca", "btl", "self,vader"]
    cmd = ["mpirun", "-np", str(workers), "--oversubscribe", "--bind-to", "none", *where,
           sys.executable, "-m", "gradsync.tools.bench", payload]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout * 4 + 600)
    if out.returncode != 0:
        raise click.ClickException(f"mpirun failed ({out.returncode}): "
                                   f"{(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@main.command()
@click.option("--workers", "-n", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--out", "-o", default="calibrated.json", show_default=True,
              help="Topology file to write (.json or .yaml).")
@click.option("--repeats", type=click.IntRange(3, 1000), default=10, show_default=True)
@click.option("--launches", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Separate process groups to measure; their medians are fitted.")
@click.option("--link-bandwidth", default=None,
              help="Calibrate over emulated slow links (e.g. 100Mbit), as 'bench --link-bandwidth' runs: each "
                   "worker in its own network namespace (root); messages up to half a second on the link.")
@format_option
def calibrate(workers, out, repeats, launches, link_bandwidth, fmt):
    """Measure latency, bandwidth and compute between local workers (or, under torchrun, mpirun
    or srun, between the job's ranks: inside and between machines apart); write a topology file."""
    from .tools import calibrate as cal
    from .tools.launch import launched

    if not out.endswith((".json", ".yaml", ".yml")):
        raise click.BadParameter(f"must end in .json, .yaml or .yml, got {out!r}", param_hint="'--out'")
    _writable(out, "--out")
    if launched() is not None:            # started by torchrun (mpirun, srun): one rank of a job across machines
        if link_bandwidth:
            raise click.BadParameter("under a launcher the ranks' own network is measured; drop it",
                                     param_hint="'--link-bandwidth'")
        fit = cal.calibrate_launched(repeats)
        if fit is None:
            return                        # rank 0 reports
    else:
        with _links(workers, link_bandwidth) as network:
            fit = cal.calibrate(workers, repeats, launches, network=network)
    path = cal.write(fit, out)
    fit["topology_file"] = str(path)

    def rows(f):
        return [["latency per round", format_time(f["round_latency_s"])],
                ["bandwidth per direction", f"{f['bandwidth_Bps'] / 1e9:.3g} GB/s"],
                ["fit's worst relative error", f"{f['fit_max_relative_error']:.1%}"]]

    def render(f):
        if "across" in f:
            click.echo(f"calibrated {f['machines']} machines x {f['local_size']} workers -> {path}")
            _print_table(["", "inside a machine", "between machines"],
                         [[a[0], a[1], b[1]] for a, b in zip(rows(f["inside"]), rows(f["across"]))])
            f, n = f["inside"], f["machines"] * f["local_size"]
            _print_table(["", "value"], [["adds per second", f"{f['add_rate']:.3g}"],
                                         ["multiply-adds per second (CERAR codec)", f"{f['madd_rate']:.3g}"]])
            click.echo(f"use it: gradsync bench --workers {n} --topology {path}")
            return
        node, check, workers = f["node"], f["ring_check"], f["workers"]
        p2p = sorted(int(n) for n in node["measured"]["exchange_s"])
        click.echo(f"calibrated {workers} workers" + (f" on emulated {link_bandwidth} links" if link_bandwidth else "")
                   + f" -> {path}")
        click.echo(f"measured: point-to-point over Gloo, k = 1..N-1 senders into one worker and an exchange "
                   f"between two, {format_size(p2p[0])}-{format_size(p2p[-1])}; adds; CERAR's codec; ring "
                   f"all-reduce {format_size(int(f['fit_sizes'][0]))}-{format_size(int(f['fit_sizes'][-1]))} (a check)")
        _print_table(["written to the topology", "value", "from"], [
            ["latency", format_time(node["latency_s"]), "fan-in: fixed cost at k = 0" if workers > 2
             else "one-way: fixed cost"],
            ["overhead per message", format_time(node["message_overhead_s"]), "fan-in: fixed cost's slope over k"
             if workers > 2 else "(needs 3+ workers: 0)"],
            ["overhead per round", format_time(node["round_overhead_s"]),
             "ring's per-round cost less latency and one send and one receive"],
            ["overhead per collective", format_time(node.get("collective_overhead_s", 0.0)),
             "ring all-reduce of 4 KB with and without the ranks' agreement on the call"],
            ["copy rate per node", f"{node['copy_rate_Bps'] / 1e9:.3g} GB/s", "fan-in rates over k (a process's "
             "limit)" + (f"; two disjoint pairs at once moved {node['pairs_over_one_way']:.2g} x one pair"
                         if node.get("pairs_over_one_way") else "")],
            ["copy rate of the machine", f"{node['machine_copy_rate_Bps'] / 1e9:.3g} GB/s",
             "N x the ring's per-byte rate (every transfer crosses it)"],
            ["incast factor", f"{node['fan_in']:.3g}", "fan-in rates over k" if workers > 2 else "(needs 3+ workers: 0)"],
            ["duplex", node["duplex"], f"exchange {node['exchange_Bps_per_direction'] / 1e9:.3g} GB/s per direction "
                                       f"vs one-way {node['one_way_Bps'] / 1e9:.3g} GB/s"],
            ["adds per second", f"{f['add_rate']:.3g}", "a local add, every rank at once"
             + (f" ({f['add_rate_alone']:.3g} by one alone)" if "add_rate_alone" in f else "")],
            ["cores the ranks' compute shares", f"{f['cores']:.2g}" if f.get("cores", workers) < workers
             else "(one per rank)", "N x adds all at once / one alone"],
            ["multiply-adds per second", f"{f['madd_rate']:.3g}", "CERAR's codec"]])
        worst_fit = max(v["worst_residual"] for v in node["fan_in_fits"].values())
        click.echo(f"fit quality: fan-in times within {worst_fit:.0%} of their lines, rates over k within "
                   f"{node['fan_in_rate_worst_error']:.0%}, exchange within {node['exchange_worst_residual']:.0%}; "
                   f"the topology's simulated ring is off the measured ring by at most {check['worst_abs_error']:.0%} "
                   f"({', '.join(f'{e:+.0%}' for e in check['relative_errors'])} at "
                   f"{', '.join(format_size(int(n)) for n in check['sizes'])})")
        links = f" --link-bandwidth {link_bandwidth}" if link_bandwidth else ""
        click.echo(f"use it: gradsync bench --workers {workers}{links} --topology {path}")

    _emit(fmt, fit, render)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; give the machine's address for other machines).")
@click.option("--port", type=click.IntRange(0, 65535), default=29400, show_default=True)
@click.option("--timeout", type=click.FloatRange(1, 1e6), default=3600.0, show_default=True,
              help="How long clients may wait on a key, in seconds.")
def store(host, port, timeout):
    """Host a rendezvous store for torchrun agents on other machines (elastic jobs that must
    survive losing any machine, including the first): start it on a machine outside the job,
    then start every agent with --rdzv-backend c10d --rdzv-endpoint HOST:PORT
    --rdzv-conf is_host=false."""
    import datetime
    import socket
    import time as time_module

    import torch.distributed as dist

    try:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(1024)
    except OSError as e:
        raise click.BadParameter(f"cannot listen on {host}:{port}: {e.strerror}", param_hint="'--host'/'--port'")
    bound = listener.getsockname()[1]
    keep = dist.TCPStore(host, bound, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout), master_listen_fd=listener.detach())
    click.echo(f"gradsync store: listening on {host}:{bound}  (agents: --rdzv-backend c10d --rdzv-endpoint "
               f"{host}:{bound} --rdzv-conf is_host=false; Ctrl-C to stop)", err=False)
    sys.stdout.flush()
    try:
        while True:
            time_module.sleep(3600)
    except KeyboardInterrupt:
        del keep


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; name another to expose it).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--export", "export_dir", type=click.Path(file_okay=False), default=None,
              help="Instead of serving, write the view as plain files into this folder (opens from file://).")
def serve(host, port, export_dir):
    """Serve the live view of every algorithm in the browser (no internet needed)."""
    import threading

    if export_dir:
        from .web.export import export

        try:
            keys = export(export_dir)
        except OSError as e:
            raise click.BadParameter(f"cannot write {export_dir!r}: {e.strerror}", param_hint="'--export'")
        click.echo(f"wrote the live view and {len(keys) - 1} precomputed files to {export_dir}/: "
                   f"open {export_dir}/index.html")
        return

    import uvicorn

    from .web import view
    from .web.app import create_app

    threading.Thread(target=view.warm_up, daemon=True).start()   # routes cached before the first visit
    click.echo(f"gradsync live view: http://{host}:{port}/  (Ctrl-C to stop)")
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")


@main.command()
@click.option("--workers", "-n", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--algorithm", "-a", default="ring", show_default=True,
              help="An algorithm (see 'gradsync list') or auto.")
@click.option("--components", "-c", type=click.IntRange(min=1), default=None, help="CERAR components (default 2N).")
@click.option("--eps", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None, help="CERAR eps.")
@click.option("--epochs", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Global batch, split across the workers.")
@click.option("--model", type=click.Choice(["mlp", "cnn"]), default="mlp", show_default=True)
@click.option("--bucket-mb", type=click.FloatRange(0, 1024, min_open=True), default=25.0, show_default=True)
@click.option("--lr", type=click.FloatRange(0, 10, min_open=True), default=0.05, show_default=True)
@click.option("--resync-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Broadcast rank 0's parameters every K steps (a remedy for CERAR's replica drift).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--link-bandwidth", default=None, help="Emulate slow links (e.g. 100Mbit); needs root.")
@click.option("--link-latency", default=None, help="Emulated link latency (needs tc netem in the kernel).")
@click.option("--compression", "-z", "codec", default=None, metavar="CODEC",
              help="Compress each gradient bucket: fp16, bf16, powersgd:rank=4, topk:ratio=0.01 or sign.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw accuracy and time per epoch (against an exact ring run) to this PNG.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace of every bucket's all-reduce (ui.perfetto.dev), a track per rank.")
@click.option("--elastic", is_flag=True,
              help="Run on torchrun's elastic agents: survive lost workers, admit replacements.")
@click.option("--min-workers", type=click.IntRange(min=1), default=None,
              help="With --elastic: train on as few as this many workers (default: all).")
@click.option("--kill-every", type=click.FloatRange(0, min_open=True), default=None,
              help="With --elastic: fault drill, SIGKILL one worker every this many seconds and replace it.")
@click.option("--transport", type=click.Choice(["gloo", "shm", "auto"]), default="gloo", show_default=True,
              help="What the gradients travel over: Gloo, shared memory (local workers), or auto.")
@format_option
def train(workers, algorithm, components, eps, epochs, batch_size, model, bucket_mb, lr, resync_every, seed,
          link_bandwidth, link_latency, codec, plot, trace_path, elastic, min_workers, kill_every, transport, fmt):
    """Train a model data-parallel on local workers (scikit-learn's digits), synchronizing with an algorithm."""
    from .training.train import TrainConfig, plot as draw, train as run_training

    if batch_size < workers:
        raise click.BadParameter(f"must be at least the number of workers ({workers})", param_hint="'--batch-size'")
    if plot and not plot.endswith(".png"):
        raise click.BadParameter(f"must end in .png, got {plot!r}", param_hint="'--plot'")
    if plot:
        _writable(plot, "--plot")
    if trace_path:
        _writable(trace_path, "--trace")
        if elastic:
            raise click.UsageError("--elastic does not combine with --trace")
    cfg = TrainConfig(algorithm, components, eps, epochs, batch_size, model, bucket_mb, lr, resync_every, seed,
                      transport=transport, compression=codec)
    cfg.check(workers)
    if transport != "gloo" and (elastic or link_bandwidth):
        raise click.BadParameter(f"--transport {transport} works with neither --elastic nor emulated links yet",
                                 param_hint="'--transport'")
    if codec is not None and elastic:
        raise click.UsageError("--compression does not combine with --elastic yet")
    if elastic:
        from .tools.launch import launched
        if launched() is not None:
            raise click.UsageError("--elastic starts torchrun's agents itself; under a launcher, run "
                                   "'torchrun ... -m gradsync.training.elastic DIR' (docs/multinode.md)")
        return _train_elastic(workers, cfg, min_workers, kill_every, link_bandwidth or link_latency or plot, fmt)
    if min_workers is not None or kill_every is not None:
        raise click.UsageError("--min-workers and --kill-every need --elastic")
    if algorithm != "auto" and not algorithms.get(algorithm).exact:   # refuse a design too inaccurate here,
        algorithms.build(algorithm, workers, 1, dtype="float32", **cfg.options())   # not in every worker
    progress = fmt == "table" and sys.stderr.isatty()
    from .tools.launch import launched
    job = launched()
    if job is not None:                   # started by torchrun (mpirun, srun): one job, on every machine it spans
        if link_bandwidth or link_latency or plot or trace_path:
            raise click.UsageError("under torchrun, mpirun or srun, train takes no --link-*, --plot or --trace")
        result = run_training(job["world"], cfg, progress and job["rank"] == 0)
        if result["rank"] != 0:
            return                        # rank 0 reports for the job
        workers = result["workers"]
        result["launcher"] = job["launcher"]
        return _emit(fmt, result, lambda r: _render_training(r, workers, algorithm, model, batch_size, None, None, None,
                                                             codec))
    with _links(workers, link_bandwidth, link_latency) as network:
        result = run_training(workers, cfg, progress, network, trace=bool(trace_path))
        if trace_path:
            _write_json(result.pop("trace"), trace_path, "--trace")
        runs = {algorithm + (f"+{codec}" if codec else ""): result}
        if plot and (algorithm != "ring" or codec):
            import dataclasses
            runs["ring (exact)"] = run_training(workers, dataclasses.replace(cfg, algorithm="ring", components=None,
                                                                             eps=None, resync_every=0,
                                                                             compression=None), progress,
                                                network)
    if plot:
        draw(runs, plot)
    result["link_bandwidth"] = link_bandwidth

    _emit(fmt, result, lambda r: _render_training(r, workers, algorithm, model, batch_size, link_bandwidth, plot,
                                                  trace_path, codec))


def _render_training(r, workers, algorithm, model, batch_size, link_bandwidth, plot, trace_path, codec=None):
    where = f", links {link_bandwidth}" if link_bandwidth else f", started by {r['launcher']}" if r.get("launcher") else ""
    click.echo(f"gradsync train: {workers} workers, {algorithm}" + (f" + {codec}" if codec else "")
               + f", {model} on digits, global batch {batch_size}{where}")
    headers = ["epoch", "loss", "test acc.", "compute", "sync", "resync", "sent/worker"]
    approx = codec is not None or (algorithm != "auto" and not algorithms.get(algorithm).exact)
    if approx:
        headers += ["grad error", "replica diff"]
    rows = []
    for h in r["history"]:
        row = [h["epoch"], f"{h['loss']:.4f}", f"{h['test_accuracy']:.3f}", format_time(h["compute_s"]),
               format_time(h["sync_s"]), format_time(h["resync_s"]) if h["resync_s"] else "-",
               format_size(h["bytes_per_worker"])]
        if approx:
            row += [f"{h['grad_rel_error']:.2g}", f"{h['replica_max_diff']:.2g}"]
        rows.append(row)
    _print_table(headers, rows)
    if plot:
        click.echo(f"plot written to {plot}")
    if trace_path:
        click.echo(f"trace written to {trace_path} (open it in ui.perfetto.dev)")


def _train_elastic(workers, cfg, min_workers, kill_every, unsupported, fmt):
    from .training import elastic

    if unsupported:
        raise click.UsageError("--elastic does not combine with --link-bandwidth, --link-latency or --plot")
    min_workers = workers if min_workers is None else min_workers
    elastic.check(workers, cfg, min_workers, kill_every)
    if fmt == "table":
        click.echo(f"gradsync train --elastic: {workers} torchrun agents (at least {min_workers}), {cfg.algorithm}, "
                   f"{cfg.model} on digits, global batch {cfg.batch_size}"
                   + (f", one worker killed every {kill_every:g} s" if kill_every else ""), err=True)
    result = elastic.train(workers, cfg, min_workers, kill_every)
    if kill_every and not result["kills"]:
        result["note"] = (f"no worker was killed: training ran {result['elapsed_s']:.0f} s, and a kill needs "
                          f"--kill-every {kill_every:g} s of running training; use a smaller --kill-every or more --epochs")
        click.echo(f"gradsync: note: {result['note']}", err=True)

    def render(r):
        _print_table(["epoch", "step", "workers", "train loss", "test acc.", "at"],
                     [[h["epoch"], h["step"], h["world_size"], f"{h['train_loss']:.4f}", f"{h['test_accuracy']:.3f}",
                       format_time(h["time"])] for h in r["history"]])
        sizes = sorted({e["world_size"] for e in r["events"]})
        click.echo(f"{len(r['kills'])} workers killed, {r['restarts']} recoveries (group sizes {sizes}); every "
                   f"recovery resumed from the last committed step with identical replicas; final step "
                   f"{r['final']['step']}, parameters sha256 {r['final']['sha256'][:16]} on all "
                   f"{r['final']['world_size']} workers")

    _emit(fmt, result, render)


@main.command()
@click.argument("directory", type=click.Path())
@format_option
def doctor(directory, fmt):
    """Read every rank's flight record in DIRECTORY (GRADSYNC_FLIGHT_DIR) and say in one paragraph
    what happened: who stopped first, the collective in flight, where each rank was."""
    from .tools.doctor import diagnose, read

    out = diagnose(read(directory))
    _emit(fmt, out, lambda o: click.echo(o["paragraph"]))


@main.group("trace")
def trace_group():
    """Read Chrome traces written by bench --trace, simulate --trace and all_reduce(trace=...)."""


@trace_group.command("compare")
@click.argument("measured", type=click.Path(dir_okay=False))
@click.argument("simulated", type=click.Path(dir_okay=False))
@format_option
def trace_compare(measured, simulated, fmt):
    """Per round, measured time (median over ranks and calls) against the simulator's, and where
    the gap is largest. MEASURED: a bench --trace file; SIMULATED: a simulate --trace file of the
    same algorithm and size (with a calibrated topology, to compare with this machine)."""
    from .tools.trace_files import compare, load

    out = compare(load(measured), load(simulated))

    def render(o):
        click.echo(f"{o['algorithm']}, {format_size(o['bytes'])}: measured {format_time(o['measured_total_s'])} "
                   f"over its rounds, simulated {format_time(o['predicted_total_s'])}")
        _print_table(["round", "measured", "simulated", "gap", "error"],
                     [[r["round"], "-" if r["measured_s"] is None else format_time(r["measured_s"]),
                       "-" if r["predicted_s"] is None else format_time(r["predicted_s"]),
                       "-" if r["gap_s"] is None else ("+" if r["gap_s"] >= 0 else "-") + format_time(abs(r["gap_s"])),
                       "-" if r["error"] is None else f"{r['error']:+.0%}"] for r in o["rounds"]])
        if o["largest_gap_round"] is not None:
            click.echo(f"largest gap: round {o['largest_gap_round']}; median error over rounds "
                       f"{o['median_abs_error']:.0%}")

    _emit(fmt, out, render)


@trace_group.command("merge")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="The merged trace to write.")
def trace_merge(traces, out):
    """Join the ranks' trace files (Trace.save on each rank) into one."""
    from .tools.trace_files import load, merge

    _writable(out, "--out")
    _write_json(merge([load(t) for t in traces]), out, "--out")
    click.echo(f"{len(traces)} traces merged into {out}")


@main.command("list")
@format_option
def list_cmd(fmt):
    """List the registered algorithms (exact or not, dtypes, options and defaults) and the topology presets."""
    from .model.topology.presets import PARAMETRIC, preset

    specs = [algorithms.get(a) for a in algorithms.names()]
    out = {"algorithms": [{"name": s.name, "exact": s.exact, "dtypes": list(s.dtypes) if s.dtypes else None,
                           "options": {k: o.default for k, o in s.options.items()}, "summary": s.summary}
                          for s in specs],
           "topologies": [{"name": name, "workers": len(topo.workers), "sized_by_workers": name in PARAMETRIC,
                           "description": topo.description} for name, topo in ((p, preset(p)) for p in PRESETS)]}

    def render(o):
        _print_table(["algorithm", "kind", "dtypes", "options (default)", "what it does"],
                     [[a["name"], "exact" if a["exact"] else "approximate", ", ".join(a["dtypes"] or ["any"]),
                       ", ".join(f"{k}={v}" for k, v in a["options"].items()) or "-", a["summary"]]
                      for a in o["algorithms"]])
        click.echo()
        _print_table(["topology", "workers", "description"],
                     [[t["name"], f"any (-n, default {t['workers']})" if t["sized_by_workers"] else t["workers"],
                       t["description"]] for t in o["topologies"]])

    _emit(fmt, out, render)


@main.command("cerar")
@click.option("--workers", "-n", type=click.IntRange(2, CERAR_WORKERS[0]), required=True, help="Workers on the ring (N).")
@click.option("--components", "-c", type=click.IntRange(1, MAX_COMPONENTS), required=True, help="Components (c).")
@click.option("--eps", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Radial step of the perturbation layers (c > N).")
@click.option("--max-cond", type=click.FloatRange(1, 1e15, max_open=True), default=None,
              help="Bound on cond(M); the design meets it (default: the best for the dtype).")
@click.option("--construction", type=click.Choice(["unity", "vandermonde", "optimized"]), default=None,
              help="Default: the one of least error for N, c and the dtype.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--elements", type=click.IntRange(1, 1 << 22), default=1 << 16, show_default=True,
              help="Elements per worker of the random gradients the error is measured on.")
@click.option("--max-error", type=click.FloatRange(0, min_open=True), default=0.01, show_default=True,
              help="Refuse a design whose relative error would be above this.")
@format_option
def cerar_cmd(workers, components, eps, max_cond, construction, dtype, elements, max_error, fmt):
    """Design a CERAR code and measure it: rounds, rates, cond(M), predicted and measured error,
    and for this N the error and communication saving of other c, up to where it stops being
    accurate enough. A c beyond that is refused (exit 2) with the largest c that is not."""
    from .coding import cerar

    most = min(1 << 24, (1 << 29) // components) // workers   # at most about 0.5 GB and 15 s to measure
    if elements > most:
        raise click.BadParameter(f"expected at most {most} elements for {workers} workers and {components} components "
                                 f"(workers x components x elements <= 2^29: 64 x 256 x 262144 took 42 s), "
                                 f"got {elements}", param_hint="'--elements'")
    with np.errstate(over="ignore", invalid="ignore"):      # an unconditionable design is refused in words
        design = cerar.make(workers, components, construction, eps=eps, max_cond=max_cond, dtype=dtype,
                            max_error=max_error)
        measured = cerar.measure(design, elements, dtype)
        largest, useful = _cerar_range(cerar, workers, components, dtype, max_error)
    out = {"workers": workers, "components": components, "construction": design.construction,
           "eps": design.eps, "scale": design.scale, "dtype": dtype, "rounds": design.rounds,
           "comm_rate": design.comm_rate, "ring_rate": design.ring_rate, "storage_rate": design.storage_rate,
           "cond": design.cond, "predicted_error": design.predicted_error(dtype),
           "checked_error": design.checked_error(dtype), "max_error": max_error,
           "rel_error": measured["rel_error"], "worst_worker": measured["worst_worker"],
           "worker_spread": measured["worker_spread"], "largest_components": largest, "range": useful}

    def render(o):
        click.echo(f"CERAR, N = {workers}, c = {components}, {o['construction']} construction"
                   + (f", eps = {o['eps']:.3g}" if o["eps"] else "") + f", {dtype}")
        _print_table(["", "value"], [
            ["rounds L = c + N - 2", o["rounds"]],
            ["communication per worker / d", f"{o['comm_rate']:.4g} (ring all-reduce: {o['ring_rate']:.4g}, "
                                             f"{o['ring_rate'] / o['comm_rate']:.3g}x more)"],
            ["storage per worker / d", f"{o['storage_rate']:.4g}"],
            ["cond(M)", f"{o['cond']:.3g}"],
            ["predicted error (worst worker, i.i.d. gradients)", f"{o['predicted_error']:.3g}"],
            ["measured error (worst worker, relative L2)", f"{o['rel_error']:.3g} (worker {o['worst_worker']})"],
            ["largest difference between two workers", f"{o['worker_spread']:.3g}"]])
        click.echo(f"\nN = {workers}, {dtype}: c against error (default design) and communication saved "
                   f"against ring all-reduce; c <= {o['largest_components']} meets max_error = {max_error:g}")
        _print_table(["c", "rounds", "sent per worker / d", "saved", "error", ""],
                     [[r["components"], r["rounds"], f"{r['comm_rate']:.4g}", f"{r['saving']:.1%}",
                       f"{r['error']:.2g}", "" if r["accepted"] else "refused"] for r in o["range"]])

    _emit(fmt, out, render)


def _cerar_range(cerar, workers, components, dtype, max_error):
    """The largest c that meets ``max_error`` for N = ``workers``, and rows of c (N, 2N, 3N,
    that largest, the first beyond it and the one asked for) against error and saving."""
    largest = cerar.largest_components(workers, dtype, max_error)
    rows = []
    for c in sorted({workers, 2 * workers, 3 * workers, largest, largest + 1, components} - {0}):
        if c > MAX_COMPONENTS:
            continue
        design = cerar.best(workers, c, dtype)
        error = design.checked_error(dtype)
        rows.append({"components": c, "rounds": design.rounds, "comm_rate": design.comm_rate,
                     "saving": 1 - design.comm_rate / design.ring_rate, "error": error,
                     "accepted": error <= max_error})
    return largest, rows


if __name__ == "__main__":
    main()
