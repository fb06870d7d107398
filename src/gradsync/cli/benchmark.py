"""``bench``: all-reduce timings between worker processes, per algorithm and size, like nccl-tests.

It runs in steps, each a function: check the arguments, set the workers' environment (restored
after), launch (local workers, mpirun, or as one rank of a launcher's job), predict each row
with the simulator, and format.

>>> with _environment({"GRADSYNC_EXAMPLE": "1"}):
...     os.environ["GRADSYNC_EXAMPLE"]
'1'
>>> "GRADSYNC_EXAMPLE" in os.environ
False
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click

from .common import (Size, _chosen, _codecs, _emit, _links, _png, _print_table, _sizes, _topology, _writable,
                     _write_json, format_option, main)
from .. import algorithms, dtypes
from ..model.cost import default_options
from ..model.simulate import simulate
from ..units import format_size, format_time, parse_bandwidth


def _check_bench_args(backend, transport, hostfile, link_bandwidth, trace_path, codec, plot) -> str:
    """Refuse the options that do not combine, before anything starts; the backend to run on
    (``--transport mpi`` is the mpi backend)."""
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
    return backend


def _bench_options(chosen, components, codec, backend, dtype):
    """Each algorithm's options (``--components``, ``--compression``) and the codec's label."""
    options = {a: {"components": components} for a in chosen
               if components and a != "auto" and "components" in algorithms.get(a).options}
    if codec is not None:
        codec = _codecs([codec])[0]
        if backend == "mpi" or dtype not in ("float32", "float64", "bfloat16"):
            raise click.BadParameter(f"needs --backend torch and a float dtype, got {backend} and {dtype}",
                                     param_hint="'--compression'")
        for a in chosen:
            options[a] = {**options.get(a, {}), "compression": codec}
    return options, codec


def _bench_environment(flight_dir) -> dict:
    """The variables bench's workers inherit: ``_bench_environment("fl")`` names the flight
    records' folder, absolute; none without ``--flight-dir``."""
    return {"GRADSYNC_FLIGHT_DIR": os.path.abspath(flight_dir)} if flight_dir else {}


@contextlib.contextmanager
def _environment(changes):
    """os.environ with ``changes`` set while the block runs (workers started in it inherit them),
    then as it was."""
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _predictor(topology, chosen, names, options, dtype, workers):
    """Bench's ``--topology``, placed for every algorithm before anything is launched, and the
    algorithms to run: the default list less what the topology cannot run (named once)."""
    from .models import _runnable_only
    if topology is None:
        return None, chosen
    workers = int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else workers
    topo = _topology(topology, workers)
    chosen = chosen if names is not None else _runnable_only(chosen, None, topo, workers)
    for name in [a for a in chosen if a != "auto"]:           # refuses e.g. 'host' on a topology without one
        opts = {**default_options(name, topo, workers), **options.get(name, {})}
        opts.pop("compression", None)
        simulate(algorithms.build(name, workers, 0, dtype=dtype, **opts), topo, dtypes.itemsize(dtype))
    return topo, chosen


def _launch(backend, engine, workers, args, timeout, hostfile, link_bandwidth, trace_path):
    """Run the benchmark where the options and the environment say; (rows, where they ran, workers),
    or None on a rank that does not report."""
    from ..tools import bench as bench_mod
    from ..tools.launch import as_launched, launched

    if backend == "mpi" and "OMPI_COMM_WORLD_RANK" in os.environ:     # inside an mpirun (or its allocation)
        if hostfile or link_bandwidth:
            raise click.UsageError("under mpirun, bench --backend mpi runs on mpirun's ranks: drop --hostfile "
                                   "and --link-bandwidth")
        engine = bench_mod.MpiEngine()
        workers = engine.comm.Get_size()
        rows = bench_mod.worker(engine.comm.Get_rank(), workers, *args, engine=engine)
        return None if rows is None else (rows, f"{workers} MPI ranks started by mpirun", workers)   # rank 0 reports
    if backend == "mpi":
        rows = _bench_mpi(workers, args, timeout, link_bandwidth, hostfile)
        return rows, (f"{workers} MPI ranks (mpirun, hosts from {hostfile})" if hostfile
                      else f"{workers} local MPI ranks (mpirun)"), workers
    if launched() is not None:            # started by torchrun (mpirun, srun): be one rank of that job
        rows, _, workers = as_launched(bench_mod.worker, *args, engine, timeout=timeout * 4 + 600)
        if rows is None:
            return None
        return rows, f"{workers} ranks started by {launched()['launcher']}, Gloo", workers
    rows = _bench_local(engine, workers, args, timeout, link_bandwidth, trace_path)
    return rows, _transports_noted(_local_where(workers, link_bandwidth), rows), workers


def _bench_local(engine, workers, args, timeout, link_bandwidth, trace_path):
    """Run the benchmark on local worker processes (over emulated links when asked); the rows,
    the trace written, each row's busbw beside the emulated link's limit."""
    from ..tools import bench as bench_mod
    from ..tools.launch import run

    with _links(workers, link_bandwidth) as network:
        results = run(bench_mod.worker, workers, *args, engine, bool(trace_path), timeout=timeout,
                      network=network, job_timeout=timeout * 4 + 600)
    rows = results[0]
    if trace_path:
        from ..tools.trace_files import merge
        rows = results[0]["rows"]
        _write_json(merge([r["trace"] for r in results]), trace_path, "--trace")
    if link_bandwidth:
        limit = parse_bandwidth(link_bandwidth)
        for r in rows:
            r["link_limit_GBps"] = limit / 1e9
            r["busbw_of_limit"] = r["busbw_GBps"] * 1e9 / limit
    return rows


def _local_where(workers, link_bandwidth):
    return (f"{workers} local workers on emulated {link_bandwidth} links (tc tbf)" if link_bandwidth
            else f"{workers} local workers, Gloo over 127.0.0.1")


def _transports_noted(where, rows):
    """``where`` with the shared-memory rows named: gradsync's rows all over it, or the ring also."""
    from ..tools.bench import NATIVE
    used = {r["transport"] for r in rows if r["algorithm"] != NATIVE}
    if used == {"shm"}:
        return where + "; gradsync's rows over shared memory"
    if "shm" in used:
        return where + "; ring also over shared memory"
    return where


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


def _predict(rows, topo, options, codec, dtype, workers):
    """Each row's time as the simulator predicts it on ``topo`` (a codec's row: its wire
    simulated plus its compute; a shared-buffer row: its memory bound plus the calibrated fixed
    costs, ``memory_bound.predicted_s``) and the prediction's error against the measured time."""
    from ..tools import bench, codec_predict, memory_bound       # (bench imports torch already)
    for r in rows:
        name = r.get("bound_algorithm") or ("ring" if r["algorithm"] == bench.NATIVE else r["algorithm"])
        opts = {**default_options(name, topo, workers), **options.get(name, {})} if name != "auto" else {}
        if "bound_s" in r:          # shared buffers: their memory bound plus the calibrated fixed costs
            sched = algorithms.build(name, workers, r["count"], dtype=dtype)
            r["predicted_s"] = memory_bound.predicted_s(r["bound_s"], sched.rounds, topo.node(topo.workers[0]))
        elif name == "auto":
            r["predicted_s"] = _auto_prediction(topo, r["count"], dtype, workers)
        elif opts.pop("compression", None) is not None and r["algorithm"] != bench.NATIVE:
            r["predicted_s"] = codec_predict.predict(codec, name, topo, r["count"], workers, opts)["time_s"]
        else:
            sched = algorithms.build(name, workers, r["count"], dtype=dtype, **opts)
            r["predicted_s"] = simulate(sched, topo, dtypes.itemsize(dtype)).time
        r["prediction_error"] = (r["predicted_s"] - r["time_s"]) / r["time_s"] if r["time_s"] else 0.0


def _auto_prediction(topo, count, dtype, workers):
    """What "auto" is predicted to take: the least simulated time of the exact algorithms on ``topo``."""
    from ..errors import GradsyncError
    best = None
    for name in algorithms.names():
        spec = algorithms.get(name)
        if not (spec.exact and spec.accepts(dtype)):
            continue
        try:
            opts = default_options(name, topo, workers)
            t = simulate(algorithms.build(name, workers, count, dtype=dtype, **opts), topo, dtypes.itemsize(dtype)).time
        except GradsyncError:
            continue                     # e.g. host on a topology without one
        best = t if best is None else min(best, t)
    return best


def _render_bench(rows, where, dtype, predicted, trace_path, plot, estimated=None):
    from ..tools.bench import conclusions

    click.echo(f"gradsync bench: {where}, {dtype}; time = median over ranks' "
               f"slowest; busbw = algbw x 2(N-1)/N"
               + ("; pred. error = (predicted - measured) / measured" if predicted else ""))
    headers = ["size", "count", "algorithm", "transport", "time", "algbw", "busbw", "max error"]
    if predicted:
        headers += ["predicted", "pred. error"]
    bounded = any("bound_s" in r for r in rows)
    if bounded:
        headers += ["memory bound"]
    table = []
    for r in rows:
        line = [format_size(r["bytes"]), r["count"], r["algorithm"], r["transport"], format_time(r["time_s"]),
                f"{r['algbw_GBps']:.3f} GB/s", f"{r['busbw_GBps']:.3f} GB/s", f"{r['max_error']:.2g}"]
        if predicted:
            line += [format_time(r["predicted_s"]), f"{r['prediction_error']:+.0%}"]
        if bounded:
            line += [f"{format_time(r['bound_s'])} ({r['over_bound']:.2f}x)" if "bound_s" in r else ""]
        table.append(line)
    _print_table(headers, table)
    for line in conclusions(rows):
        click.echo(line)
    if bounded:
        click.echo("memory bound: the least time the shared-buffer all-reduce can take here (the bytes it copies and "
                   "sums over the rates the workers measured at the start); in brackets, the row's time over it.")
    click.echo("max error: the largest difference from the exact sum (float64, every rank's input), over the "
               "sum's largest magnitude; exact algorithms show only rounding (about 1e-7 in float32), "
               "approximate ones (cerar) their approximation, refused above its max_error (1e-2).")
    if predicted and any(r["transport"] in ("shm", "native", "mixed") for r in rows):
        click.echo("predicted: the simulator's time on the topology's links; rows over shared memory and the "
                   "engine's own all-reduce (predicted as a ring) do not use those links as modelled, so their "
                   "errors measure how far they are from that model.")
    if estimated is not None and rows and "peak_rss_bytes" in rows[-1]:
        click.echo(f"memory: estimated {format_size(estimated['per_worker_bytes'])} per worker before the start, "
                   f"measured peak {format_size(max(r['peak_rss_bytes'] for r in rows))} (the largest worker's "
                   f"resident memory)")
    if trace_path:
        click.echo(f"trace written to {trace_path} (open it in ui.perfetto.dev)")
    if plot:
        click.echo(f"plot written to {plot}")


def _bench_chosen(names, dtype) -> list[str]:
    """``--algorithms``, where "auto" is a row too (``all_reduce(algorithm="auto")``):
    ``_bench_chosen("ring,auto", "float32") == ["ring", "auto"]``."""
    if names is None:
        return _chosen(None, dtype)
    parts = [a.strip() for a in names.split(",") if a.strip()]
    rest = [a for a in parts if a != "auto"]
    if rest or not parts:
        _chosen(",".join(rest) if rest else names, dtype)
    return parts


def _check_fits(byte_sizes, workers, chosen, dtype, iters, beside, sizes_given):
    """The run's estimate (``tools.bench.estimate``), or a one-line refusal naming it and the
    largest size that fits, when all workers together would need more than 90% of the memory
    available: ``_check_fits([4000], 2, ["ring"], "float32", None, 0, True)["total_bytes"] > 0``."""
    from ..tools.bench import BASELINE_BYTES, available_memory, estimate

    est = estimate(byte_sizes, workers, chosen, dtype, beside, iters)
    avail = available_memory()
    room = 0.9 * avail
    if est["total_bytes"] <= room:
        return est
    fit = (room / workers - BASELINE_BYTES) / est["per_byte"]
    itemsize = dtypes.itemsize(dtype)
    nice = [m * 1000**k for k in range(1, 5) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
    largest = max((n for n in nice if n <= fit and n % itemsize == 0), default=None)
    option = "--sizes" if sizes_given else "--max-size"
    most = int(room // (BASELINE_BYTES + est["per_byte"] * min(byte_sizes)))
    hint = (f"the largest size that fits is {format_size(largest)} ({option} {format_size(largest).replace(' ', '')})"
            if largest else f"{workers} workers alone take about {format_size(workers * BASELINE_BYTES)}: at most "
                            f"{most} fit")
    raise click.BadParameter(
        f"bench would need about {format_size(est['total_bytes'])} of memory ({workers} workers x "
        f"{format_size(est['per_worker_bytes'])} at {format_size(est['largest'])}), and "
        f"{format_size(avail)} is available: {hint}, or use fewer --workers or --algorithms",
        param_hint=f"'{option}'")


@main.command()
@click.option("--workers", "-n", type=click.IntRange(2, 64), default=4, show_default=True,
              help="Local worker processes (Gloo over 127.0.0.1).")
@click.option("--algorithms", "names", default=None,
              help="Comma-separated algorithms (default: every one that takes the dtype; see 'gradsync list'), "
                   "or 'auto' (gradsync's choice); the engine's own all-reduce runs as 'native'.")
@click.option("--sizes", default=None, help="Comma-separated message sizes in bytes (e.g. 4KB,1MB,64MB, 4KiB).")
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
    """Time all-reduce between local worker processes, per algorithm and size, like nccl-tests.

    Before anything starts, bench estimates each worker's memory from the sizes, the workers
    and the algorithms (a copy of the tensor per row, the exact reference in float64, each
    algorithm's scratch) and the time, and refuses in one line (exit code 2) a run that would
    not fit in the memory available, naming the estimate and the largest size that fits.
    Sizes are bytes (4KB, 4kb and 4k are 4000 B; 4KiB is 4096). It ends with, per size, the
    fastest algorithm against the engine's own all-reduce (the native row)."""
    from ..tools import bench as bench_mod
    from ..tools.launch import launched

    backend = _check_bench_args(backend, transport, hostfile, link_bandwidth, trace_path, codec, plot)
    # the default list over Gloo also shows shared memory where the ranks share a host
    engine = bench_mod.TorchEngine(transport, shared_rows=names is None and transport == "gloo" and codec is None
                                   and not (link_bandwidth or trace_path))
    chosen = _bench_chosen(names, dtype)
    with _environment(_bench_environment(flight_dir)):
        options, codec = _bench_options(chosen, components, codec, backend, dtype)
        byte_sizes = _sizes(sizes, min_size, max_size, dtype)
        topo, chosen = _predictor(topology, chosen, names, options, dtype, workers)   # a bad topology first
        estimated = None if hostfile or backend == "mpi" or launched() is not None else \
            _check_fits(byte_sizes, workers, chosen, dtype, iters, int(engine.shared_rows), sizes is not None)
        if estimated is not None and sys.stderr.isatty() and fmt == "table":
            click.echo(f"gradsync bench: about {format_time(estimated['seconds'])} and "
                       f"{format_size(estimated['total_bytes'])} of memory (estimated)", err=True)
        args = (byte_sizes, chosen, iters, dtype, timeout, options, fmt == "table" and sys.stderr.isatty())
        ran = _launch(backend, engine, workers, args, timeout, hostfile, link_bandwidth, trace_path)
    if ran is None:
        return                            # rank 0 reports
    rows, where, workers = ran
    if topo is None and link_bandwidth and "RANK" not in os.environ:    # the emulated switch, as a topology
        from ..model.topology import preset
        topo = preset("ethernet", workers=workers, nic=link_bandwidth, latency="50us")
    if topo is not None:
        _predict(rows, topo, options, codec, dtype, workers)
    if codec is not None:
        for r in rows:
            if r["algorithm"] != bench_mod.NATIVE:
                r["algorithm"], r["compression"] = f"{r['algorithm']}+{codec}", codec
    if plot:
        from ..tools.plots import bench_plot
        bench_plot(rows, plot, f"gradsync bench: {where}, {dtype}")
    _emit(fmt, rows, lambda rows: _render_bench(rows, where, dtype, topo is not None, trace_path, plot, estimated))
