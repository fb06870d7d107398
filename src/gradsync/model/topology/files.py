"""Load topologies from TOML, JSON or YAML files, with errors that name the bad field.

A cluster is one table instead of its nodes and links (``cluster.cluster``'s parameters)::

    name = "training-cluster"
    cluster = {machines = 2048, gpus = 8, shape = "rail", oversubscription = 2}

Example (TOML)::

    name = "two-gpus"
    workers = ["gpu0", "gpu1"]
    host = "cpu"
    nodes = [{name = "gpu0", kind = "gpu"}, {name = "gpu1", kind = "gpu"},
             {name = "cpu", kind = "cpu"}, {name = "sw", kind = "switch"}]
    links = [{a = "gpu0", b = "sw", bandwidth = "16GB/s", latency = "1us"},
             {a = "gpu1", b = "sw", bandwidth = "16GB/s"}, {a = "cpu", b = "sw", bandwidth = "16GB/s"}]
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ...errors import ConfigError, TopologyError
from ...units import parse_bandwidth, parse_time
from .model import Link, Node, Topology
from .presets import preset

MAX_FILE_BYTES = 16 << 20


def _parsed(parse):
    """A pydantic validator from a units parser: its ConfigError becomes the field's error."""
    def check(v):
        try:
            return parse(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return AfterValidator(check)


Bandwidth = Annotated[float | str, _parsed(parse_bandwidth)]     # bytes/s, or a string with units
Duration = Annotated[float | str, _parsed(parse_time)]           # seconds, or a string with units


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSpec(_Strict):
    name: str = Field(min_length=1, max_length=200)
    kind: Literal["gpu", "cpu", "host", "switch", "nic"]
    reduce_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    madd_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    copy_rate: Bandwidth | None = None
    message_overhead: Duration | None = None
    fan_in: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    collective_overhead: Duration | None = None
    round_overhead: Duration | None = None
    cores: float | None = Field(default=None, ge=1, allow_inf_nan=False)


class LinkSpec(_Strict):
    a: str
    b: str
    bandwidth: Bandwidth
    latency: Duration = 0.0
    duplex: Literal["full", "half"] = "full"


class TopologySpec(_Strict):
    name: str = Field(default="custom", max_length=200)
    description: str = Field(default="", max_length=2000)
    nodes: list[NodeSpec] = Field(min_length=1, max_length=100_000)
    links: list[LinkSpec] = Field(min_length=1, max_length=1_000_000)
    workers: list[str] = Field(min_length=1)
    host: str | None = None
    rings: list[list[int]] | None = None
    ring_weights: list[float] | None = None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}"


def from_dict(data, source: str = "topology") -> Topology:
    """Build a topology from a parsed file; raise ``TopologyError`` naming the bad field.

    >>> t = from_dict({"nodes": [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "gpu"}],
    ...                "links": [{"a": "a", "b": "b", "bandwidth": "10GB/s"}], "workers": ["a", "b"]})
    >>> t.links[0].bandwidth
    10000000000.0
    """
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a table/object at the top level, got {type(data).__name__}")
    if "cluster" in data:
        return _cluster_file(data, source)
    try:
        spec = TopologySpec.model_validate(data)
    except ValidationError as exc:
        raise TopologyError(f"{source}: {_first_error(exc)}") from None
    rings = None
    if spec.rings is not None:
        n = len(spec.workers)
        for k, ring in enumerate(spec.rings):
            if sorted(ring) != list(range(n)):
                raise TopologyError(f"{source}: rings.{k}: must be a permutation of 0..{n - 1}")
        rings = tuple(tuple(r) for r in spec.rings)
        weights = spec.ring_weights or [1.0] * len(rings)
        if len(weights) != len(rings) or min(weights) <= 0:
            raise TopologyError(f"{source}: ring_weights: need {len(rings)} positive numbers")
    try:
        return Topology(
            spec.name, tuple(Node(n.name, n.kind, n.reduce_rate, n.madd_rate, n.copy_rate,
                                   message_overhead=n.message_overhead or None, fan_in=n.fan_in or None,
                                   collective_overhead=n.collective_overhead or None, cores=n.cores,
                                   round_overhead=n.round_overhead or None)
                       for n in spec.nodes),
            tuple(Link(l.a, l.b, l.bandwidth, l.latency, l.duplex) for l in spec.links),
            tuple(spec.workers), spec.host, rings,
            tuple(weights) if rings else None, spec.description)
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def _cluster_file(data: dict, source: str) -> Topology:
    """A file's ``cluster`` table as the generated cluster, with the file's name and description."""
    extra = sorted(set(data) - {"cluster", "name", "description"})
    if extra:
        raise TopologyError(f"{source}: a cluster file takes cluster, name and description; got {', '.join(extra)}")
    params = data["cluster"]
    if not isinstance(params, dict):
        raise TopologyError(f"{source}: cluster: expected a table of parameters, got {type(params).__name__}")
    params = dict(params)
    workers = params.pop("workers", None)
    try:
        topo = preset("cluster", workers, **params)
    except TopologyError as exc:
        raise TopologyError(f"{source}: cluster: {exc}") from None
    return Topology(str(data.get("name", topo.name)), topo.nodes, topo.links, topo.workers, None,
                    description=str(data.get("description", topo.description)), router=topo.router)


def load(path: str | Path) -> Topology:
    """Load a topology from a ``.toml``, ``.json``, ``.yaml`` or ``.yml`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml"):
        raise TopologyError(f"{path}: unknown file type {suffix!r}: expected .toml, .json, .yaml or .yml")
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise TopologyError(f"{path}: file is larger than {MAX_FILE_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read: {exc}") from None
    return loads(text, suffix, source=str(path))


def loads(text: str, suffix: str, source: str = "topology") -> Topology:
    """Parse topology text of the given file type (``.toml``, ``.json``, ``.yaml``)."""
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError, ValueError,
            RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TopologyError(f"{source}: not valid {suffix[1:].upper()}: {first}") from None
    return from_dict(data, source)
