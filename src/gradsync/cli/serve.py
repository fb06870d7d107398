"""The commands that listen until stopped: ``serve`` (the live view in the browser, or its files)
and ``store`` (a rendezvous store for torchrun agents on other machines)."""

from __future__ import annotations

import sys

import click

from .common import main


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
        from ..web.export import export

        try:
            out = export(export_dir)
        except OSError as e:
            raise click.BadParameter(f"cannot write {export_dir!r}: {e.strerror}", param_hint="'--export'")
        click.echo(f"wrote the live view to {export_dir}/ ({out['bytes'] / 1e6:.1f} MB: {sum(out['families'].values())} "
                   f"schedules, {out['topologies']} topologies, simulated in the page): open {export_dir}/index.html")
        return

    import socket

    import uvicorn

    from ..web import view
    from ..web.app import create_app

    # bound here, before the URL is printed: a busy port is one line and exit code 2, not a
    # printed URL followed by the server's own bind error
    try:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # a restart need not wait out TIME_WAIT
        listener.bind((host, port))
    except OSError as e:
        raise click.BadParameter(f"cannot listen on {host}:{port}: {e.strerror}", param_hint="'--host'/'--port'")
    threading.Thread(target=view.warm_up, daemon=True).start()   # routes cached before the first visit
    click.echo(f"gradsync live view: http://{host}:{listener.getsockname()[1]}/  (Ctrl-C to stop)")
    server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning"))
    server.run(sockets=[listener])
