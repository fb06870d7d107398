"""The live view as plain files: ``gradsync serve --export DIR`` writes the page, its script,
gradsync's simulator as the page reads it (``static/model.js``) and the model's data, so it
runs from a folder (or ``file://``) with no server and every control live.

The data are one description with two readers: each algorithm's schedules (per worker count
offered and options, their pieces as cut labels: ``site_model``) and each topology preset
(per worker count: nodes with their rates, links, the drawing's layout). The page times them
for any size, bandwidth, latency and failure (with the runtime's
detection parameters, read from ``gradsync.runtime``: ``failures.detection_defaults``). Data files are scripts
(``window.gradsyncData(key, value)``), not JSON fetched by the page: browsers refuse ``fetch``
of ``file://`` URLs but run scripts from them.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .. import algorithms
from ..errors import ConfigError
from . import failures, site_model, view
from .options import view_options
from .layout import fills, layout

OFFERED = tuple(range(2, 65))                        # worker counts offered on presets that grow: all the page takes
SEGMENTS = tuple(1 << k for k in range(6))           # the view's tree shapes (options.tree_segments)
REF_BYTES = 160_000_000                              # options that depend on the size are fixed per shape
MIN_BYTES = 4000                                     # below, some schedules change shape (checked from here)
HALF_PRECISION = ("fp16", "bf16")     # codecs the export offers: the same schedule, 2-byte elements
NODE_FIELDS = ("reduce_rate", "madd_rate", "copy_rate", "message_overhead", "fan_in", "collective_overhead", "cores",
               "round_overhead")


def _write(folder: Path, key: str, value) -> int:
    text = f"window.gradsyncData({json.dumps(key)}, {json.dumps(value, allow_nan=False, separators=(',', ':'))});\n"
    (folder / f"{key}.js").write_text(text)
    return len(text)


def worker_counts(topology: str) -> list[int]:
    """The worker counts the export offers on ``topology``: ``worker_counts("pcie-switch-4")`` is [2, 3, 4]."""
    most = view.fixed_workers(topology)
    return list(range(2, most + 1)) if most else list(OFFERED)


def topology_data(preset: str, n: int) -> dict:
    """Preset ``preset`` with ``n`` workers as the page's model reads it, with its drawing."""
    topo = view.topology_for(preset, n)
    pos, bends = layout(preset, topo)
    return {"name": topo.name, "preset": preset, "description": topo.description,
            "fixed_workers": view.fixed_workers(preset), "fill": fills(preset),
            "nodes": [{"name": nd.name, "kind": nd.kind, "x": x, "y": y,
                       **{f: getattr(nd, f) for f in NODE_FIELDS if getattr(nd, f)}}
                      for nd, (x, y) in zip(topo.nodes, pos)],
            "links": [{"a": topo.index[l.a], "b": topo.index[l.b], "bandwidth": l.bandwidth, "latency": l.latency,
                       "duplex": l.duplex, "bend": b} for l, b in zip(topo.links, bends)],
            "workers": [topo.index[w] for w in topo.workers], "host": topo.index.get(topo.host)}


def _variants(algorithm: str, topo, n: int) -> list[dict]:
    """The option sets the view uses for ``algorithm`` at ``n`` workers on ``topo``: one, or one
    per tree shape."""
    options = view_options(algorithm, topo, n, REF_BYTES, None, None)
    options.pop("max_error", None)
    if "segments" not in options:
        return [options]
    return [{**options, "segments": s} for s in SEGMENTS]


DESIGN = ("construction", "eps", "scale")      # a coded schedule's design, found once and reused at every size


def _family(algorithm: str, n: int, options: dict, dtype: str = "float32") -> dict:
    spec = algorithms.get(algorithm)
    extra = {"max_error": None} if "max_error" in spec.options else {}
    ref = algorithms.build(algorithm, n, site_model.REF, dtype=dtype, **options, **extra)
    if ref.codec is not None:      # the design does not depend on the size: build it once, not at every size checked
        extra.update({k: ref.options[k] for k in DESIGN if ref.options.get(k) is not None and k in spec.options})
    data = site_model.schedule_data(lambda d: algorithms.build(algorithm, n, d, dtype=dtype, **options, **extra))
    tokens = [f"\u00ab{i}\u00bb" for i in range(ref.nodes)]     # the page puts each preset's names in
    # the sentences; each round's list of transfers the page writes from the transfers themselves
    data["narration"] = [{k: v for k, v in x.items() if k != "transfers"}
                         for x in view.narration(spec, ref, view.chunk_cuts(ref), tokens)]
    data["estimate"] = view.design_estimate(ref)
    data["channel"] = view.channels(ref)
    return data


def export(folder, topologies=None) -> dict:
    """Write the static view into ``folder`` (created if missing); return what it holds: the
    schedule families per algorithm, the topologies, and the bytes written.

    >>> import tempfile; out = export(tempfile.mkdtemp(), topologies=("pcie-switch-4",))
    >>> out["topologies"], out["families"]["ring"]
    (3, 3)
    """
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"export folder {str(folder)!r} is a file")
    (root / "static").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    static = resources.files("gradsync.web").joinpath("static")
    page = static.joinpath("index.html").read_text()
    page = page.replace('<script src="static/state.js"></script>',
                        '<script>window.GRADSYNC_STATIC = true;</script>\n<script src="static/model.js"></script>\n'
                        '<script src="static/site.js"></script>\n<script src="static/state.js"></script>')
    written = len(page)
    (root / "index.html").write_text(page)
    for name in sorted(f.name for f in static.iterdir() if f.name.endswith((".js", ".css"))):
        text = static.joinpath(name).read_text()
        written += len(text)
        (root / "static" / name).write_text(text)
    topologies = tuple(topologies or view.TOPOLOGIES)
    names = [a for a in algorithms.names() if algorithms.get(a).accepts("float32")]
    families = {a: {} for a in names}
    index, topo_data = {}, {}
    for preset in topologies:
        for n in worker_counts(preset):
            topo_data[f"{preset}|{n}"] = topology_data(preset, n)
            # links of one bandwidth (the page's bandwidth field) may change an algorithm's
            # options (no slower tier: one machine); those are indexed apart ("|uniform")
            for links, topo in (("", view.topology_for(preset, n)), ("|uniform", view.topology_for(preset, n, 1e9))):
                for name in names:
                    for options in _variants(name, topo, n):
                        key = f"{n}|{json.dumps(options, sort_keys=True)}"
                        try:
                            if key not in families[name]:
                                families[name][key] = _family(name, n, options)
                        except (ConfigError, site_model.Unfit):
                            families[name][key] = None          # not defined there: the page says so
                        index[f"{name}|{preset}|{n}|{options.get('segments', 0)}{links}"] = key
    for name in names:
        written += _write(root / "data", f"schedules-{name}", {k: site_model.packed(v) for k, v in families[name].items() if v})
    core = {"topologies": list(topologies), "algorithms": names, "index": index, "presets": topo_data,
            "worker_counts": {p: worker_counts(p) for p in topologies},
            "fixed_workers": {p: view.fixed_workers(p) for p in topologies if view.fixed_workers(p)},
            "explanations": {a: " ".join(algorithms.get(a).explanation.split()) for a in names},
            "summaries": {a: algorithms.get(a).summary for a in names},
            "exact": {a: algorithms.get(a).exact for a in names},
            "compressions": list(HALF_PRECISION), "exact_only": [a for a in names if algorithms.get(a).exact],
            "limits": {"min_bytes": MIN_BYTES, "max_bytes": 4 * 10**9, "bandwidth": view.BANDWIDTH_RANGE,
                       "latency": view.LATENCY_RANGE, "max_cells": view.MAX_CELLS, "tree_segments": view.TREE_SEGMENTS},
            "book_figures": view.BOOK_FIGURES,
            "detection": failures.detection_defaults()}     # the runtime's own check interval and timeout
    written += _write(root / "data", "model", core)
    return {"families": {a: sum(1 for v in f.values() if v) for a, f in families.items()},
            "topologies": len(topo_data), "bytes": written}
