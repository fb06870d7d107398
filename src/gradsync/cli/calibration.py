"""``calibrate``: latency, bandwidth and compute measured between local workers (or between a
launcher's ranks, inside and between machines apart), fitted and written as a topology file."""

from __future__ import annotations

import click

from .common import _emit, _links, _print_table, _writable, format_option, main
from ..units import format_size, format_time


def _fit_rows(f):
    """The three figures every fit states, as table rows."""
    return [["latency per round", format_time(f["round_latency_s"])],
            ["bandwidth per direction", f"{f['bandwidth_Bps'] / 1e9:.3g} GB/s"],
            ["fit's worst relative error", f"{f['fit_max_relative_error']:.1%}"]]


def _render_machines(f, path):
    """A launcher's job: inside a machine and between machines side by side, then the compute rates."""
    click.echo(f"calibrated {f['machines']} machines x {f['local_size']} workers -> {path}")
    _print_table(["", "inside a machine", "between machines"],
                 [[a[0], a[1], b[1]] for a, b in zip(_fit_rows(f["inside"]), _fit_rows(f["across"]))])
    f, n = f["inside"], f["machines"] * f["local_size"]
    _print_table(["", "value"], [["adds per second", f"{f['add_rate']:.3g}"],
                                 ["multiply-adds per second (CERAR codec)", f"{f['madd_rate']:.3g}"]])
    click.echo(f"use it: gradsync bench --workers {n} --topology {path}")


def _written_rows(f):
    """Each figure written to the topology, its value, and what it was measured from."""
    node, workers = f["node"], f["workers"]
    return [
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
        ["multiply-adds per second", f"{f['madd_rate']:.3g}", "CERAR's codec"]]


def _render_calibrated(f, path, link_bandwidth):
    """Local workers: what was measured, what was written, how well it fits, and how to use it."""
    if "across" in f:
        return _render_machines(f, path)
    node, check, workers = f["node"], f["ring_check"], f["workers"]
    p2p = sorted(int(n) for n in node["measured"]["exchange_s"])
    click.echo(f"calibrated {workers} workers" + (f" on emulated {link_bandwidth} links" if link_bandwidth else "")
               + f" -> {path}")
    click.echo(f"measured: point-to-point over Gloo, k = 1..N-1 senders into one worker and an exchange "
               f"between two, {format_size(p2p[0])}-{format_size(p2p[-1])}; adds; CERAR's codec; ring "
               f"all-reduce {format_size(int(f['fit_sizes'][0]))}-{format_size(int(f['fit_sizes'][-1]))} (a check)")
    _print_table(["written to the topology", "value", "from"], _written_rows(f))
    worst_fit = max(v["worst_residual"] for v in node["fan_in_fits"].values())
    click.echo(f"fit quality: fan-in times within {worst_fit:.0%} of their lines, rates over k within "
               f"{node['fan_in_rate_worst_error']:.0%}, exchange within {node['exchange_worst_residual']:.0%}; "
               f"the topology's simulated ring is off the measured ring by at most {check['worst_abs_error']:.0%} "
               f"({', '.join(f'{e:+.0%}' for e in check['relative_errors'])} at "
               f"{', '.join(format_size(int(n)) for n in check['sizes'])})")
    links = f" --link-bandwidth {link_bandwidth}" if link_bandwidth else ""
    click.echo(f"use it: gradsync bench --workers {workers}{links} --topology {path}")


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
    from ..tools import calibrate as cal
    from ..tools.launch import launched

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
    _emit(fmt, fit, lambda f: _render_calibrated(f, path, link_bandwidth))
