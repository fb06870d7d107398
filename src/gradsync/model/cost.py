"""Closed-form alpha-beta-gamma costs of the algorithms on a topology.

Each algorithm module states its own formula (``cost``); this module reads the parameters
off a topology: alpha is the route latency between two workers, beta 1 / the route's
bottleneck bandwidth, gamma 1 / a worker's reduce rate. The formulas assume every worker
sees the same route to every other (a switch); on meshes they are an estimate, and the
simulator is the reference.
"""

from __future__ import annotations

from .. import algorithms
from ..algorithms._common import Net
from .topology import Topology


def ring_options(topology: Topology, workers: int) -> dict:
    """The ring orders and weights a topology prefers for ``workers`` workers (may be empty)."""
    if topology.rings and workers == len(topology.workers) and all(len(r) == workers for r in topology.rings):
        return {"rings": [list(r) for r in topology.rings], "weights": list(topology.ring_weights)}
    return {}


def default_options(algorithm: str, topology: Topology, workers: int) -> dict:
    """Options an algorithm gets on a topology when the user gives none: the topology's
    preferred rings, for algorithms that take ``rings``; its machines, for algorithms that
    take ``local_size``. ``default_options("tree", topo, 4)`` is {}."""
    takes = algorithms.get(algorithm).options
    options = ring_options(topology, workers) if "rings" in takes else {}
    if "local_size" in takes:
        options["local_size"] = topology.machine_size(workers)
    return options


def uniform(topology: Topology, workers: int) -> bool:
    """Whether every pair of the first ``workers`` workers sees the same route latency and
    bandwidth as workers 0 and 1 (one switch): there the closed forms match the simulator.

    >>> from gradsync.model.topology import preset
    >>> uniform(preset("ethernet", workers=8), 8), uniform(preset("lowbw-cluster"), 8)
    (True, False)
    """
    names = topology.workers[:workers]
    if workers < 2:
        return True
    first = topology.path_alpha_beta(names[0], names[1])
    return all(topology.path_alpha_beta(a, b) == first for a, b in zip(names, names[1:] + names[:1])) and \
        all(topology.path_alpha_beta(names[0], b) == first for b in names[1:])


def net_for(topology: Topology, workers: int, options: dict | None = None) -> Net:
    """Alpha-beta-gamma parameters of ``topology`` for the first ``workers`` workers.

    >>> from gradsync.model.topology import preset
    >>> net_for(preset("pcie-switch-4"), 4).beta * 16e9
    1.0
    """
    names = topology.workers[:workers]
    # the slowest route between neighbouring workers: on one switch any pair's, across a slow
    # link (two servers) the link's, which bounds every algorithm that crosses it
    pairs = list(zip(names, names[1:] + names[:1])) if workers > 1 else [(names[0], names[0])]
    alpha, beta = max(topology.path_alpha_beta(a, b) for a, b in pairs)
    rate, madd_rate = topology.reduce_rate(names[0]), topology.madd_rate(names[0])
    gamma = 1.0 / rate if rate else 0.0
    mu = 1.0 / madd_rate if madd_rate else 0.0
    host = {}
    if topology.host is not None:
        host_alpha, host_beta = topology.path_alpha_beta(names[0], topology.host)
        host_rate = topology.reduce_rate(topology.host)
        host = dict(host_alpha=host_alpha, host_beta=host_beta,
                    host_gamma=1.0 / host_rate if host_rate else 0.0)
    local = (options or {}).get("local_size")
    if local and 1 < local < workers and workers % local == 0:
        # across machines: the rails (worker i and i + L); inside: neighbours in one machine
        alpha, beta = max(topology.path_alpha_beta(names[i], names[(i + local) % workers]) for i in range(workers))
        inside = [topology.path_alpha_beta(names[i], names[i + 1]) for i in range(workers - 1) if (i + 1) % local]
        host["local_alpha"], host["local_beta"] = max(inside)
    ring_betas = ()
    rings = (options or {}).get("rings")
    if rings:
        ring_betas = tuple(max(topology.path_alpha_beta(names[r[i]], names[r[(i + 1) % workers]])[1]
                               for i in range(workers)) for r in rings)
        alpha = max(topology.path_alpha_beta(names[r[i]], names[r[(i + 1) % workers]])[0]
                    for r in rings for i in range(workers))
    return Net(alpha, beta, gamma, mu, ring_betas=ring_betas, **host)


def predict(algorithm: str, topology: Topology, workers: int, nbytes: float, itemsize: int = 4,
            **options) -> float:
    """Closed-form time of ``algorithm`` all-reducing ``nbytes`` over ``workers`` workers.

    >>> from gradsync.model.topology import preset
    >>> round(predict("sharded", preset("pcie-switch-4"), 4, 160e6), 4)
    0.015
    """
    if not options:
        options = default_options(algorithm, topology, workers)
    spec = algorithms.get(algorithm)
    spec.check_options(options)
    return spec.cost(workers, nbytes, net_for(topology, workers, options), itemsize=itemsize, **options)


TERMS = {"latency": ("alpha", "host_alpha"), "bandwidth": ("beta", "host_beta", "ring_betas"),
         "reduction": ("gamma", "host_gamma"), "codec": ("mu",)}


def terms(algorithm: str, topology: Topology, workers: int, nbytes: float, itemsize: int = 4,
          **options) -> dict:
    """``predict``'s time split into its latency (alpha), bandwidth (beta), reduction (gamma)
    and codec (mu) terms: the algorithm's closed form with only that parameter kept. The
    closed forms are sums of the four, so the terms add up to ``closed_form``; one that takes
    the slowest of several paths (several rings of different speeds) does not split exactly,
    and ``overlap`` (closed form minus the terms) says by how much.

    >>> from gradsync.model.topology import preset
    >>> t = terms("ring", preset("ethernet", 4), 4, 4e6)
    >>> round(t["latency"] * 1e6), round(t["latency"] + t["bandwidth"] + t["reduction"] + t["codec"], 9) == round(t["closed_form"], 9)
    (120, True)
    """
    import dataclasses

    if not options:
        options = default_options(algorithm, topology, workers)
    spec = algorithms.get(algorithm)
    spec.check_options(options)
    net = net_for(topology, workers, options)

    def only(kept):
        zeroed = {}
        for f in dataclasses.fields(net):
            value = getattr(net, f.name)
            if f.name in kept or value is None:
                continue
            zeroed[f.name] = tuple(0.0 for _ in value) if isinstance(value, tuple) else 0.0
        return dataclasses.replace(net, **zeroed)

    out = {name: spec.cost(workers, nbytes, only(fields), itemsize=itemsize, **options) for name, fields in TERMS.items()}
    out["closed_form"] = spec.cost(workers, nbytes, net, itemsize=itemsize, **options)
    out["overlap"] = out["closed_form"] - sum(out[name] for name in TERMS)
    return out
