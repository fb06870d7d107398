"""``train``: a model trained data-parallel on local workers, on the job's ranks under a launcher,
or on torchrun's elastic agents (``--elastic``), synchronizing with an algorithm."""

from __future__ import annotations

import sys

import click

from .common import _emit, _links, _png, _print_table, _writable, _write_json, format_option, main
from .. import algorithms
from ..units import format_size, format_time


def _check_train_args(workers, batch_size, plot, trace_path, elastic):
    """Refuse, before any work, a batch smaller than the group, a plot that is not a writable
    .png and a trace that cannot be written or is asked of an elastic run."""
    if batch_size < workers:
        raise click.BadParameter(f"must be at least the number of workers ({workers})", param_hint="'--batch-size'")
    if plot:
        _png(plot)
    if trace_path:
        _writable(trace_path, "--trace")
        if elastic:
            raise click.UsageError("--elastic does not combine with --trace")


def _check_train_combinations(transport, elastic, link_bandwidth, codec):
    """Refuse the options that do not combine yet: shared memory with elastic runs or emulated
    links, compression with elastic runs."""
    if transport == "shm" and (elastic or link_bandwidth):
        raise click.BadParameter("--transport shm works with neither --elastic nor emulated links yet",
                                 param_hint="'--transport'")
    if codec is not None and elastic:
        raise click.UsageError("--compression does not combine with --elastic yet")


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
@click.option("--transport", type=click.Choice(["gloo", "shm", "auto"]), default="auto", show_default=True,
              help="What the gradients travel over: Gloo, shared memory (local workers), or auto "
                   "(shared memory where the workers share a host; Gloo with --elastic or emulated links).")
@format_option
def train(workers, algorithm, components, eps, epochs, batch_size, model, bucket_mb, lr, resync_every, seed,
          link_bandwidth, link_latency, codec, plot, trace_path, elastic, min_workers, kill_every, transport, fmt):
    """Train a model data-parallel on local workers (scikit-learn's digits), synchronizing with an algorithm."""
    from ..tools.launch import launched
    from ..training.train import TrainConfig

    _check_train_args(workers, batch_size, plot, trace_path, elastic)
    if transport == "auto" and link_bandwidth:
        transport = "gloo"      # emulated links are Gloo's sockets (elastic training says "auto" is Gloo itself)
    cfg = TrainConfig(algorithm, components, eps, epochs, batch_size, model, bucket_mb, lr, resync_every, seed,
                      transport=transport, compression=codec)
    cfg.check(workers)
    _check_train_combinations(transport, elastic, link_bandwidth, codec)
    if elastic:
        if launched() is not None:
            raise click.UsageError("--elastic starts torchrun's agents itself; under a launcher, run "
                                   "'torchrun ... -m gradsync.training.elastic DIR' (docs/multinode.md)")
        return _train_elastic(workers, cfg, min_workers, kill_every, link_bandwidth or link_latency or plot, fmt)
    if min_workers is not None or kill_every is not None:
        raise click.UsageError("--min-workers and --kill-every need --elastic")
    if algorithm != "auto" and not algorithms.get(algorithm).exact:   # refuse a design too inaccurate here,
        algorithms.build(algorithm, workers, 1, dtype="float32", **cfg.options())   # not in every worker
    progress = fmt == "table" and sys.stderr.isatty()
    job = launched()
    if job is not None:                   # started by torchrun (mpirun, srun): one job, on every machine it spans
        if link_bandwidth or link_latency or plot or trace_path:
            raise click.UsageError("under torchrun, mpirun or srun, train takes no --link-*, --plot or --trace")
        return _train_launched(job, cfg, progress, fmt)
    result = _train_local(workers, cfg, progress, link_bandwidth, link_latency, plot, trace_path)
    _emit(fmt, result, lambda r: _render_training(r, workers, algorithm, model, batch_size, link_bandwidth, plot,
                                                  trace_path, codec))


def _train_launched(job, cfg, progress, fmt):
    """Train as one rank of the launcher's job; rank 0 reports for the job."""
    from ..training.train import train as run_training

    result = run_training(job["world"], cfg, progress and job["rank"] == 0)
    if result["rank"] != 0:
        return
    workers = result["workers"]
    result["launcher"] = job["launcher"]
    return _emit(fmt, result, lambda r: _render_training(r, workers, cfg.algorithm, cfg.model, cfg.batch_size, None,
                                                         None, None, cfg.compression))


def _train_local(workers, cfg, progress, link_bandwidth, link_latency, plot, trace_path):
    """Train on local workers (over emulated links when asked); with a plot, an exact ring run
    beside an approximate or compressed one. The result, its trace written."""
    from ..training.train import plot as draw, train as run_training

    codec = cfg.compression
    with _links(workers, link_bandwidth, link_latency) as network:
        result = run_training(workers, cfg, progress, network, trace=bool(trace_path))
        if trace_path:
            _write_json(result.pop("trace"), trace_path, "--trace")
        runs = {cfg.algorithm + (f"+{codec}" if codec else ""): result}
        if plot and (cfg.algorithm != "ring" or codec):
            import dataclasses
            runs["ring (exact)"] = run_training(workers, dataclasses.replace(cfg, algorithm="ring", components=None,
                                                                             eps=None, resync_every=0,
                                                                             compression=None), progress,
                                                network)
    if plot:
        draw(runs, plot)
    result["link_bandwidth"] = link_bandwidth
    return result


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


def _render_elastic(r):
    _print_table(["epoch", "step", "workers", "train loss", "test acc.", "at"],
                 [[h["epoch"], h["step"], h["world_size"], f"{h['train_loss']:.4f}", f"{h['test_accuracy']:.3f}",
                   format_time(h["time"])] for h in r["history"]])
    sizes = sorted({e["world_size"] for e in r["events"]})
    click.echo(f"{len(r['kills'])} workers killed, {r['restarts']} recoveries (group sizes {sizes}); every "
               f"recovery resumed from the last committed step with identical replicas; final step "
               f"{r['final']['step']}, parameters sha256 {r['final']['sha256'][:16]} on all "
               f"{r['final']['world_size']} workers")


def _train_elastic(workers, cfg, min_workers, kill_every, unsupported, fmt):
    """Train on ``workers`` torchrun agents that survive lost workers (a kill every
    ``kill_every`` seconds as a drill); ``unsupported`` is an option that does not combine."""
    from ..training import elastic

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
    _emit(fmt, result, _render_elastic)
