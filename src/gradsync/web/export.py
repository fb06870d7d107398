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
from ..core.narrate import narrate
from ..core.schedule import COPY
from ..model.topology.presets import pcie_switch
from . import failures, lesson, site_model, view
from .options import view_options
from .layout import fills, layout

OFFERED = tuple(range(2, 65))                        # worker counts offered on presets that grow: all the page takes
SEGMENTS = tuple(1 << k for k in range(6))           # the view's tree shapes (options.tree_segments)
REF_BYTES = 160_000_000                              # options that depend on the size are fixed per shape
MIN_BYTES = 4                                        # one float32 element: every size the served page takes
CLOSED_SIZES = (100_000_000, 200_000_000)            # bytes the closed forms' affine terms are fitted at
CHART_SWITCH = (2, 3, 4, 8, 16, 32, 64)              # the chart's pcie-switch-N: D2L's server grown to N GPUs
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
    return _topology_of(view.topology_for(preset, n), preset)


def _topology_of(topo, preset: str) -> dict:
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
    data["narration"] = view.narration(spec, ref, view.chunk_cuts(ref), tokens, detail=False)
    data["estimate"] = view.design_estimate(ref)
    data["channel"] = view.channels(ref)
    return data


def _page(root: Path) -> int:
    """The page and its scripts, with the model's readers (model.js, failures.js, site.js) first."""
    static = resources.files("gradsync.web").joinpath("static")
    page = static.joinpath("index.html").read_text()
    page = page.replace('<script src="static/state.js"></script>',
                        '<script>window.GRADSYNC_STATIC = true;</script>\n<script src="static/model.js"></script>\n'
                        '<script src="static/failures.js"></script>\n<script src="static/site.js"></script>\n<script src="static/state.js"></script>')
    written = len(page)
    (root / "index.html").write_text(page)
    for name in sorted(f.name for f in static.iterdir() if f.name.endswith((".js", ".css"))):
        text = static.joinpath(name).read_text()
        written += len(text)
        (root / "static" / name).write_text(text)
    return written


def _configurations(topologies):
    """(preset, workers, topology, the same with links of one bandwidth, its data) for every
    preset and worker count offered, and D2L's server grown to N GPUs for the chart."""
    for preset in topologies:
        for n in worker_counts(preset):
            yield preset, n, view.topology_for(preset, n), view.topology_for(preset, n, 1e9), topology_data(preset, n)
    if "pcie-switch-4" in topologies:
        for n in CHART_SWITCH:
            topo = pcie_switch(n)
            yield "pcie-switch-N", n, topo, view.with_links(topo, 1e9, None), _topology_of(topo, "pcie-switch-4")


def _families(topologies, names) -> tuple[dict, dict, dict, dict]:
    """Every schedule family the page may draw, keyed by workers and options; the index from
    (algorithm, preset, workers, segments, links) to it; the topologies; the closed forms."""
    families, index, topo_data, closed = {a: {} for a in names}, {}, {}, {}
    placed = set()                    # families whose helpers run somewhere they are indexed
    for preset, n, topo, uniform, data in _configurations(topologies):
        topo_data[f"{preset}|{n}"] = data
        data["reducers"] = {"": _reducers(topo, n), "|uniform": _reducers(uniform, n)}
        # links of one bandwidth (the page's bandwidth field) may change an algorithm's
        # options (no slower tier: one machine); those are indexed apart ("|uniform")
        for links, t in (("", topo), ("|uniform", uniform)):
            for name in names:
                for options in _variants(name, t, n):
                    key = f"{n}|{json.dumps(options, sort_keys=True)}"
                    if key not in families[name]:
                        families[name][key] = _try_family(name, n, options)
                    where = f"{name}|{preset}|{n}|{options.get('segments', 0)}"
                    index[where + links] = key
                    family = families[name][key]
                    if family and all(h == "host" or isinstance(data["reducers"][links].get(h), int)
                                      for h in family["helpers"]):
                        placed.add((name, key))
                        if not links:
                            closed[where] = closed_terms(name, t, n, options)
    for name, found in families.items():       # a switch that reduces on no preset: nothing to export
        for key in found:
            if (name, key) not in placed:
                found[key] = None
    return families, index, topo_data, closed


def _reducers(topo, n: int) -> dict:
    """Where a schedule's switch helpers run on ``topo`` with ``n`` workers, as the simulator
    places them (``Topology.reducer_for``): per helper name its node's index, or the refusal
    with the algorithm's name left as ``{algorithm}`` for the page to fill in."""
    out = {}
    for helper in ["switch"] + [f"switch{m}" for m in range(len(topo.reducers))]:
        try:
            out[helper] = topo.index[topo.reducer_for(n, helper, "{algorithm}")]
        except ConfigError as e:
            out[helper] = {"refused": str(e)}
    return out


def _try_family(name: str, n: int, options: dict, dtype: str = "float32") -> dict | None:
    try:
        return _family(name, n, options, dtype)
    except (ConfigError, site_model.Unfit):
        return None                          # not defined there: the page says so


def closed_terms(name: str, topo, n: int, options: dict) -> dict | None:
    """The closed form's terms as affine functions of the gradient's bytes (intercept, slope),
    from two sizes (the closed forms are affine in n for fixed options), with the formula in
    words and the parameters read off the topology; None where there is none."""
    spec = algorithms.get(name)
    options = {k: v for k, v in options.items() if k != "max_error"}
    at = [lesson.closed_form(spec, topo, n, size, 4, options) for size in CLOSED_SIZES]
    if at[0] is None or at[1] is None:
        return None
    lo, hi = at[0]["terms"], at[1]["terms"]
    slope = {k: (hi[k] - lo[k]) / (CLOSED_SIZES[1] - CLOSED_SIZES[0]) for k in lo}
    return {"formula": at[0]["formula"], "net": at[0]["net"],
            "terms": {k: [lo[k] - slope[k] * CLOSED_SIZES[0], slope[k]] for k in lo}}


def _extras(names, counts) -> dict:
    """Families beside the algorithms': the ring's all-gather (top-k and sign gather their
    payloads) and CERAR in float16 (fp16 packets; its design is the float16 one)."""
    gathers = {}
    for n in counts:
        gathers[str(n)] = _gather_family(n)
    cerar16 = {}
    if "cerar" in names:
        for n in counts:
            topo = view.topology_for("ring", n)
            options = {k: v for k, v in view_options("cerar", topo, n, REF_BYTES, None, None).items() if k != "max_error"}
            cerar16[f"{n}|{json.dumps(options, sort_keys=True)}|float16"] = _try_family("cerar", n, options, "float16")
    return {"gathers": gathers, "cerar16": cerar16}


def _gather_family(n: int) -> dict | None:
    """The ring's all-gather of n parts (``runtime.compressed.all_gather_schedule``), as a
    family over the gathered buffer (always a multiple of n elements)."""
    from ..runtime.compressed import all_gather_schedule
    try:
        data = site_model.schedule_data(lambda d: all_gather_schedule(n, d // n), n * (site_model.REF // n),
                                        [n * max(1, c // n) for c in site_model.CHECKED])
    except site_model.Unfit:
        return None
    ref = all_gather_schedule(n, site_model.REF // n)
    tokens = [f"\u00ab{i}\u00bb" for i in range(ref.nodes)]
    data["narration"] = narrate(ref, view.chunk_cuts(ref), tokens, {COPY: "all-gather"}, detail=False)
    data["estimate"], data["channel"] = None, None
    return data


def export(folder, topologies=None) -> dict:
    """Write the static view into ``folder`` (created if missing); return what it holds: the
    schedule families per algorithm, the topologies, and the bytes written.

    >>> import tempfile; out = export(tempfile.mkdtemp(), topologies=("pcie-switch-4",))
    >>> out["topologies"], out["families"]["ring"]      # 2-4 GPUs, and the chart's 8-64 on one switch
    (3, 7)
    """
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"export folder {str(folder)!r} is a file")
    (root / "static").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    written = _page(root)
    topologies = tuple(topologies or view.TOPOLOGIES)
    names = [a for a in algorithms.names() if algorithms.get(a).accepts("float32")]
    families, index, topo_data, closed = _families(topologies, names)
    extras = _extras(names, sorted({int(k.split("|")[1]) for k in topo_data}))
    families.setdefault("cerar", {}).update(extras["cerar16"])
    families["all_gather"] = extras["gathers"]
    for name in families:
        found = {k: site_model.packed(v) for k, v in families[name].items() if v}
        forms = site_model.told_in_forms(found)
        written += _write(root / "data", f"schedules-{name}", {"forms": forms, "families": found})
    written += _write(root / "data", "model", _core(topologies, names, index, topo_data, closed))
    return {"families": {a: sum(1 for v in f.values() if v) for a, f in families.items()},
            "topologies": sum(not k.startswith("pcie-switch-N") for k in topo_data), "bytes": written}


def _core(topologies, names, index, topo_data, closed) -> dict:
    return {"topologies": list(topologies), "algorithms": names, "index": index, "presets": topo_data,
            "closed": closed, "chart_switch": list(CHART_SWITCH),
            "worker_counts": {p: worker_counts(p) for p in topologies},
            "fixed_workers": {p: view.fixed_workers(p) for p in topologies if view.fixed_workers(p)},
            "explanations": {a: " ".join(algorithms.get(a).explanation.split()) for a in names},
            "summaries": {a: algorithms.get(a).summary for a in names},
            "exact": {a: algorithms.get(a).exact for a in names},
            "dtypes": {a: algorithms.get(a).dtypes for a in names},
            "compressions": list(view.COMPRESSIONS),
            "limits": {"min_bytes": MIN_BYTES, "max_bytes": 4 * 10**9, "bandwidth": view.BANDWIDTH_RANGE,
                       "latency": view.LATENCY_RANGE, "max_cells": view.MAX_CELLS, "tree_segments": view.TREE_SEGMENTS},
            "book_figures": view.BOOK_FIGURES,
            "detection": failures.detection_defaults()}     # the runtime's own check interval and timeout
