"""What gradsync offers: ``list`` (the registered algorithms and the topology presets) and ``cerar``
(design a CERAR code and measure it)."""

from __future__ import annotations

import click
import numpy as np

from . import common
from .common import _emit, _print_table, format_option, main
from .. import algorithms
from ..model.topology import PRESETS


def _render_list(o):
    _print_table(["algorithm", "kind", "dtypes", "options (default)", "what it does"],
                 [[a["name"], "exact" if a["exact"] else "approximate", ", ".join(a["dtypes"] or ["any"]),
                   ", ".join(f"{k}={v}" for k, v in a["options"].items()) or "-", a["summary"]]
                  for a in o["algorithms"]])
    click.echo()
    _print_table(["topology", "workers", "description"],
                 [[t["name"], f"any (-n, default {t['workers']})" if t["sized_by_workers"] else t["workers"],
                   t["description"]] for t in o["topologies"]])


@main.command("list")
@format_option
def list_cmd(fmt):
    """List the registered algorithms (exact or not, dtypes, options and defaults) and the topology presets."""
    from ..model.topology.presets import PARAMETRIC, preset

    specs = [algorithms.get(a) for a in algorithms.names()]
    out = {"algorithms": [{"name": s.name, "exact": s.exact, "dtypes": list(s.dtypes) if s.dtypes else None,
                           "options": {k: o.default for k, o in s.options.items()}, "summary": s.summary}
                          for s in specs],
           "topologies": [{"name": name, "workers": len(topo.workers), "sized_by_workers": name in PARAMETRIC,
                           "description": topo.description} for name, topo in ((p, preset(p)) for p in PRESETS)]}
    _emit(fmt, out, _render_list)


def _cerar_range(cerar, workers, components, dtype, max_error):
    """The largest c that meets ``max_error`` for N = ``workers``, and rows of c (N, 2N, 3N,
    that largest, the first beyond it and the one asked for) against error and saving."""
    largest = cerar.largest_components(workers, dtype, max_error)
    rows = []
    for c in sorted({workers, 2 * workers, 3 * workers, largest, largest + 1, components} - {0}):
        if c > common.MAX_COMPONENTS:
            continue
        design = cerar.best(workers, c, dtype)
        error = design.checked_error(dtype)
        rows.append({"components": c, "rounds": design.rounds, "comm_rate": design.comm_rate,
                     "saving": 1 - design.comm_rate / design.ring_rate, "error": error,
                     "accepted": error <= max_error})
    return largest, rows


def _render_cerar(o, max_error):
    workers, dtype = o["workers"], o["dtype"]
    click.echo(f"CERAR, N = {workers}, c = {o['components']}, {o['construction']} construction"
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


@main.command("cerar")
@click.option("--workers", "-n", type=click.IntRange(2, common.CERAR_WORKERS[0]), required=True,
              help="Workers on the ring (N).")
@click.option("--components", "-c", type=click.IntRange(1, common.MAX_COMPONENTS), required=True,
              help="Components (c).")
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
    from ..coding import cerar

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
    _emit(fmt, out, lambda o: _render_cerar(o, max_error))
