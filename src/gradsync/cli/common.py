"""What the commands share: the group they register on, whose errors are one line on stderr and
exit code 2; the limits they refuse beyond; the options; and the checks of sizes, workers,
paths and names, each a one-line error naming the option.

The limits are read here when a command runs (tests lower them on this module).

>>> _elements(4000, "float32"), _ladder(4000, 64_000)
(1000, [4000, 16000, 64000])
"""

from __future__ import annotations

import json
import os
import sys

import click

from .. import algorithms, dtypes
from ..errors import GradsyncError
from ..model.topology import PRESETS, resolve
from ..units import format_size, parse_bandwidth, parse_size

_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
# The dtypes the simulating commands offer, in the table's order: every one but the narrow
# integers, which the command line has never offered.
DTYPE_CHOICES = [name for name in dtypes.names() if name not in ("int8", "uint8", "int16")]


class Cli(click.Group):
    """A click group whose errors are one line and exit code 2, never a traceback."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS_IS_HELP as exc:
            if exc.ctx is not None and isinstance(exc.ctx.command, click.Group):   # `gradsync` alone: its help
                click.echo(exc.ctx.get_help())
                sys.exit(0)
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


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gradsync", prog_name="gradsync")
def main():
    """gradsync: gradient synchronization strategies, simulated, costed and compared."""


class Size(click.ParamType):
    """A size option in bytes: ``160MB``, ``4kb`` (4000 B), ``4KiB`` (4096 B) or a bare number of
    bytes, parsed by ``units.parse_size``."""

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


topology_option = click.option("--topology", "-t", default="pcie-switch-4", show_default=True,
                               help=f"A preset ({', '.join(PRESETS)}) or a .toml/.json/.yaml file.")
workers_option = click.option("--workers", "-n", type=int, default=None,
                              help="Workers (sizes the ethernet preset; else the first N devices).")
dtype_option = click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="float32", show_default=True)
format_option = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)
compression_option = click.option(
    "--compression", "-z", "codecs", multiple=True, metavar="CODEC",
    help="Also a compressed exchange, e.g. fp16, bf16, powersgd:rank=4, topk:ratio=0.01, sign (repeatable).")


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


def _tuned_topology(name, workers, max_error):
    """The topology for tune and explain: up to TUNED workers, or CERAR_TUNED when CERAR designs
    are weighed (``--max-error``): ``_tuned_topology("ring", 16, None)``."""
    topo = _topology(name, workers, TUNED)
    if max_error is not None and len(topo.workers) > CERAR_TUNED[0]:
        raise click.BadParameter(f"takes at most {CERAR_TUNED[0]} workers, got {len(topo.workers)}: {CERAR_TUNED[1]}",
                                 param_hint="'--max-error'")
    return topo


def _elements(nbytes, dtype, option="--size", most=MAX_BYTES) -> int:
    """The whole number of ``dtype`` elements in ``nbytes``; one line naming the size unless it is one
    element to ``most`` bytes and a multiple of the element size: ``_elements(4000, "float32") == 1000``."""
    itemsize = dtypes.itemsize(dtype)
    if not itemsize <= nbytes <= most or nbytes % itemsize:
        got = f"{nbytes} B" if nbytes < 10**15 else format_size(nbytes)
        raise click.BadParameter(f"expected a whole number of {dtype} elements ({itemsize} B each) from "
                                 f"{itemsize} B to {format_size(most)}, got {got}", param_hint=f"'{option}'")
    return nbytes // itemsize


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
    return [n for n in _ladder(min_size, max_size) if n % dtypes.itemsize(dtype) == 0]


def _writable(path, option):
    """Refuse, before any long work, an output path that cannot be written: ``_writable("c.json", "--out")``."""
    folder = os.path.dirname(os.path.abspath(path))
    problem = ("it is a directory" if os.path.isdir(path) else
               f"no directory {folder!r}" if not os.path.isdir(folder) else
               f"directory {folder!r} is not writable" if not os.access(folder, os.W_OK) else
               "the file is not writable" if os.path.exists(path) and not os.access(path, os.W_OK) else None)
    if problem:
        raise click.BadParameter(f"cannot write {path!r}: {problem}", param_hint=f"'{option}'")


def _png(path, option="--plot"):
    """Refuse, before any work, a plot path that is not a writable .png: ``_png("a.png")``."""
    if path is None:
        return
    if not path.endswith(".png"):
        raise click.BadParameter(f"must end in .png, got {path!r}", param_hint=f"'{option}'")
    _writable(path, option)


def _write_json(data, path, option):
    """Write ``data`` as JSON; one line naming ``option`` if the file cannot be written:
    ``_write_json({"traceEvents": []}, "t.json", "--trace")``."""
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path!r}: {exc.strerror}", param_hint=f"'{option}'")


def _chosen(names, dtype) -> list[str]:
    """The algorithms of a comma-separated ``--algorithms`` list, each checked against the
    registry and the dtype; when none is given, every registered one that takes the dtype:
    ``_chosen("ring,tree", "float32") == ["ring", "tree"]``."""
    if names is None:
        return [a for a in algorithms.names() if algorithms.get(a).accepts(dtype)]
    chosen = [a.strip() for a in names.split(",") if a.strip()]
    if not chosen:
        raise click.BadParameter(f"expected comma-separated algorithm names, got {names!r}",
                                 param_hint="'--algorithms'")
    for a in chosen:
        algorithms.get(a).check_dtype(dtype)
    return chosen


def _affordable(chosen, names, workers, hint="'--algorithms'"):
    """``chosen`` without CERAR above CERAR_WORKERS: a note when it came from the default list,
    a one-line refusal when named (``names`` not None): ``_affordable(["ring"], None, 4)``."""
    most, why = CERAR_WORKERS
    if "cerar" not in chosen or workers <= most:
        return chosen
    message = f"takes at most {most} workers, got {workers}: {why}"
    if names is not None:
        raise click.BadParameter(f"cerar {message}", param_hint=hint)
    click.echo(f"gradsync: note: cerar left out: it {message}", err=True)
    return [a for a in chosen if a != "cerar"]


def _codecs(codecs) -> list[str]:
    """The ``--compression`` values, each checked (a bad one is one line, exit code 2):
    ``_codecs(["fp16"])``."""
    from ..compression import make
    return [make(c).label for c in codecs]


def _links(workers, bandwidth, latency=None):
    """Slow-link namespaces when asked for, else a context that changes nothing:
    ``with _links(4, None) as network: ...``."""
    import contextlib

    if bandwidth is None and latency is None:
        return contextlib.nullcontext(None)
    from ..tools.links import SlowLinks

    if bandwidth is None:
        raise click.BadParameter("--link-latency needs --link-bandwidth too", param_hint="'--link-latency'")
    parse_bandwidth(bandwidth)
    return SlowLinks(workers, bandwidth, latency)


def _steps(total, label):
    """A progress bar on stderr when it is a terminal, else a no-op: ``step = _steps(3, "compare")``."""
    if not sys.stderr.isatty():
        return lambda description: None
    from ..tools.progress_bar import bar
    return bar(total, label)


def _emit(fmt, rows, render):
    """``rows`` as indented JSON for ``--format json``, else ``render(rows)``:
    ``_emit("json", [{"a": 1}], print)``."""
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        render(rows)


def _print_table(headers, rows):
    """A table on stdout, 160 columns wide, long cells folded: ``_print_table(["a"], [[1]])``."""
    from rich.console import Console
    from rich.table import Column, Table

    t = Table(*(Column(h, overflow="fold") for h in headers), box=None, header_style="bold", pad_edge=False)
    for row in rows:
        t.add_row(*map(str, row))
    Console(width=160).print(t)
