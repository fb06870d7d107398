"""PNG plots of bench and tune results (matplotlib, Agg: no display needed).

``bench_plot``: bus bandwidth against message size, a line per algorithm (the engine's own
all-reduce included, as "native"). ``tune_plot``: predicted time against message size, a line
per candidate, with the crossovers (where the fastest changes) marked.

Example::

    rows = json.load(open("bench.json"))          # gradsync bench --format json
    bench_plot(rows, "busbw.png", "4 local workers, Gloo")
"""

from __future__ import annotations

from collections import defaultdict


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))      # a Figure of its own: no pyplot state, no display
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def bench_plot(rows: list[dict], path: str, title: str = "") -> dict:
    """Draw busbw (GB/s) against size per algorithm from bench rows; return the plotted series
    ({algorithm: [(bytes, busbw_GBps), ...]})."""
    series = defaultdict(list)
    for r in rows:
        shared = r.get("transport") in ("shm", "mixed")      # beside the same algorithm over Gloo
        name = f"{r['algorithm']} ({r['transport']})" if shared else r["algorithm"]
        series[name].append((r["bytes"], r["busbw_GBps"]))
    fig, ax = _figure()
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                linestyle="--" if name == "native" else "-", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s) = algbw x 2(N-1)/N")
    ax.set_title(title or "gradsync bench")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return dict(series)


def tune_plot(rows: list[dict], crossovers: list[dict], path: str, title: str = "") -> dict:
    """Draw predicted time against size per candidate from tune rows, crossovers as vertical
    lines; return the plotted series ({candidate: [(bytes, seconds), ...]})."""
    series = defaultdict(list)
    for r in rows:
        for name, seconds in r["times_s"].items():
            series[name].append((r["bytes"], seconds))
    fig, ax = _figure()
    for name, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
    for c in crossovers:
        ax.axvline(c["bytes"], color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{c['below']} -> {c['above']}", (c["bytes"], 0.98), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=7, color="dimgrey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("predicted time (s)")
    ax.set_title(title or "gradsync tune")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return dict(series)
