"""Topologies: the model, built-in presets and file loading."""

from pathlib import Path

from ...errors import TopologyError
from .files import from_dict, load, loads
from .model import Link, Node, Topology
from .presets import PRESETS, preset


def resolve(name_or_path: str, workers: int | None = None) -> Topology:
    """A preset by name, or a topology file by path: ``resolve("p3.16xlarge")``."""
    if name_or_path in PRESETS:
        return preset(name_or_path, workers)
    path = Path(name_or_path)
    if not path.exists():
        raise TopologyError(f"unknown topology {name_or_path!r}: expected a preset "
                            f"({', '.join(PRESETS)}) or an existing .toml/.json/.yaml file")
    topo = load(path)
    return topo if workers is None else topo.with_workers(workers)


__all__ = ["Link", "Node", "PRESETS", "Topology", "from_dict", "load", "loads", "preset", "resolve"]
