"""Topologies: the model, built-in presets and file loading."""

from pathlib import Path

from ...errors import TopologyError
from .files import from_dict, load, loads
from .model import Link, Node, Topology
from .presets import PRESETS, preset


def _value(text: str):
    """A preset parameter's value from text: an integer, a number, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_preset(text: str) -> tuple[str, dict] | None:
    """``"cluster:machines=4,gpus=8"`` as its preset name and parameters; None if ``text`` names
    no preset: ``parse_preset("cluster:machines=4")`` is ('cluster', {'machines': 4})."""
    name, sep, rest = text.partition(":")
    if name not in PRESETS:
        return None
    params = {}
    for pair in filter(None, rest.split(",")) if sep else ():
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise TopologyError(f"topology {text!r}: expected {name}:KEY=VALUE,..., got {pair!r}")
        params[key.strip()] = _value(value.strip())
    return name, params


def resolve(name_or_path: str, workers: int | None = None) -> Topology:
    """A preset by name (with parameters: ``cluster:machines=2048,gpus=8``), or a topology file
    by path: ``resolve("p3.16xlarge")``."""
    found = parse_preset(name_or_path) if isinstance(name_or_path, str) else None
    if found:
        return preset(found[0], workers, **found[1])
    path = Path(name_or_path)
    if not path.exists():
        raise TopologyError(f"unknown topology {name_or_path!r}: expected a preset "
                            f"({', '.join(PRESETS)}) or an existing .toml/.json/.yaml file")
    topo = load(path)
    return topo if workers is None else topo.with_workers(workers)


__all__ = ["Link", "Node", "PRESETS", "Topology", "from_dict", "load", "loads", "preset", "resolve"]
