"""A progress bar on stderr for long local runs (bench, train); rank 0 draws it."""

from __future__ import annotations

import sys


def bar(total: int, label: str):
    """Start a bar of ``total`` steps; call the result with a description per step, None to end.

    Example: ``step = bar(3, "bench"); step("ring 4 KB"); step(None)``.
    """
    from rich.console import Console
    from rich.progress import Progress

    progress = Progress(transient=True, console=Console(file=sys.stderr))
    task = progress.add_task(label, total=total)
    progress.start()

    def step(description):
        if description is None:
            progress.stop()
        else:
            progress.update(task, advance=1, description=description)
    return step
