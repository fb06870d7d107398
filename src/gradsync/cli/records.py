"""The commands that read what runs left behind: ``doctor`` (the ranks' flight records) and
``trace compare`` / ``trace merge`` (Chrome traces)."""

from __future__ import annotations

import click

from .common import _emit, _print_table, _writable, _write_json, format_option, main
from ..units import format_size, format_time


@main.command()
@click.argument("directory", type=click.Path())
@format_option
def doctor(directory, fmt):
    """Read every rank's flight record in DIRECTORY (GRADSYNC_FLIGHT_DIR) and say in one paragraph
    what happened: who stopped first, the collective in flight, where each rank was."""
    from ..tools.doctor import diagnose, read

    out = diagnose(read(directory))
    _emit(fmt, out, lambda o: click.echo(o["paragraph"]))


@main.group("trace")
def trace_group():
    """Read Chrome traces written by bench --trace, simulate --trace and all_reduce(trace=...)."""


def _signed_time(seconds):
    """A gap with its sign: ``_signed_time(-0.002)`` is '-2 ms'; '-' for none."""
    if seconds is None:
        return "-"
    return ("+" if seconds >= 0 else "-") + format_time(abs(seconds))


def _render_trace_compare(o):
    click.echo(f"{o['algorithm']}, {format_size(o['bytes'])}: rounds summed, measured "
               f"{format_time(o['measured_total_s'])} and simulated {format_time(o['predicted_total_s'])}; "
               f"gap = simulated - measured, error = (simulated - measured) / measured, as in bench")
    _print_table(["round", "measured", "simulated", "gap", "error"],
                 [[r["round"], "-" if r["measured_s"] is None else format_time(r["measured_s"]),
                   "-" if r["predicted_s"] is None else format_time(r["predicted_s"]), _signed_time(r["gap_s"]),
                   "-" if r["error"] is None else f"{r['error']:+.0%}"] for r in o["rounds"]])
    if o["largest_gap_round"] is not None:
        click.echo(f"largest gap: round {o['largest_gap_round']}; median error over rounds "
                   f"{o['median_abs_error']:.0%}")
    if o.get("measured_call_s") is not None and o.get("predicted_call_s") is not None:
        click.echo(f"whole collective: measured {format_time(o['measured_call_s'])} (the median call, as bench "
                   f"times it: its rounds plus agreeing, setting up and finishing), simulated "
                   f"{format_time(o['predicted_call_s'])} (the simulation's end, as simulate reports it: ranks' "
                   f"rounds overlap, so it is not their sum)")


@trace_group.command("compare")
@click.argument("measured", type=click.Path(dir_okay=False))
@click.argument("simulated", type=click.Path(dir_okay=False))
@format_option
def trace_compare(measured, simulated, fmt):
    """Per round, measured time (median over ranks and calls) against the simulator's, and where
    the gap is largest. MEASURED: a bench --trace file; SIMULATED: a simulate --trace file of the
    same algorithm and size (with a calibrated topology, to compare with this machine)."""
    from ..tools.trace_files import compare, load

    out = compare(load(measured), load(simulated))
    _emit(fmt, out, _render_trace_compare)


@trace_group.command("merge")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="The merged trace to write.")
def trace_merge(traces, out):
    """Join the ranks' trace files (Trace.save on each rank) into one."""
    from ..tools.trace_files import load, merge

    _writable(out, "--out")
    _write_json(merge([load(t) for t in traces]), out, "--out")
    click.echo(f"{len(traces)} traces merged into {out}")
