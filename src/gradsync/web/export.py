"""The live view as plain files: ``gradsync serve --export DIR`` writes the page, its script
and precomputed timelines, so it runs from a folder (or ``file://``) with no server.

Each topology is exported at its own worker count (8 for the ring and Ethernet presets) and
160 MB, with every registered algorithm and its chart; the page then offers only those
choices. Data files are scripts (``window.gradsyncData(key, value)``), not JSON fetched by the
page: browsers refuse ``fetch`` of ``file://`` URLs but run scripts from them.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .. import algorithms
from ..errors import ConfigError
from . import view

SIZE = 160_000_000
DEFAULT_WORKERS = 8


def _write(folder: Path, key: str, value) -> None:
    text = f"window.gradsyncData({json.dumps(key)}, {json.dumps(value, allow_nan=False)});\n"
    (folder / f"{key}.js").write_text(text)


def export(folder, topologies=None) -> list[str]:
    """Write the static view into ``folder`` (created if missing); return the data keys written.

    >>> import tempfile; keys = export(tempfile.mkdtemp(), topologies=("pcie-switch-4",))
    >>> "sim-ring-pcie-switch-4" in keys and "presets" in keys
    True
    """
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"export folder {str(folder)!r} is a file")
    (root / "static").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    static = resources.files("gradsync.web").joinpath("static")
    page = static.joinpath("index.html").read_text()
    page = page.replace('<script src="static/app.js"></script>',
                        '<script>window.GRADSYNC_STATIC = true;</script>\n<script src="static/app.js"></script>')
    (root / "index.html").write_text(page)
    for name in ("app.js", "style.css"):
        (root / "static" / name).write_text(static.joinpath(name).read_text())
    topologies = tuple(topologies or view.TOPOLOGIES)
    names = [a for a in algorithms.names() if algorithms.get(a).accepts("float32")]
    keys = []
    fixed = {t: view.fixed_workers(t) or DEFAULT_WORKERS for t in topologies}
    _write(root / "data", "presets", {"topologies": list(topologies), "algorithms": names, "fixed_workers": fixed,
                                      "static": {"size": "160MB"}})
    keys.append("presets")
    for topology in topologies:
        for name in names:
            try:
                _write(root / "data", f"sim-{name}-{topology}",
                       view.simulate_now(name, topology, fixed[topology], SIZE))
                keys.append(f"sim-{name}-{topology}")
            except ConfigError:
                continue           # not defined there (the page says so when chosen)
            _write(root / "data", f"compare-{topology}-{name}",
                   view.compare_now(SIZE, topology, None, None, None, None, (name,)))
            keys.append(f"compare-{topology}-{name}")
    return keys
