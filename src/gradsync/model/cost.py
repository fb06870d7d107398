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


def runnable(algorithm: str, topology: Topology, workers: int, options: dict | None = None) -> str | None:
    """Why ``algorithm`` cannot run on ``topology`` (a sentence), or None where it can: the
    helper nodes its spec ``needs`` (a host, a switch that reduces, one per machine).

    >>> from gradsync.model.topology import preset
    >>> runnable("ring", preset("cluster"), 16), runnable("host", preset("cluster"), 16)
    (None, "algorithm 'host' needs a host node; topology 'cluster' has none")
    """
    from ..errors import ConfigError
    spec = algorithms.get(algorithm)
    if "host" in spec.needs and topology.host is None:
        return f"algorithm {algorithm!r} needs a host node; topology {topology.name!r} has none"
    try:
        if "switch" in spec.needs:
            topology.reducer_for(workers, "switch", algorithm)
        if "switches" in spec.needs:
            local = (options or {}).get(spec.machine_option or "") or topology.machine_size(workers)
            machines = workers // local if workers % local == 0 else 0
            for m in range(max(machines, 1)):
                topology.reducer_for(workers, f"switch{m}", algorithm)
    except ConfigError as exc:
        return str(exc)
    return None


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


def _alpha_beta(topology: Topology, a: str, b: str, protocol=None) -> tuple[float, float]:
    """Alpha and beta of the route a -> b: its latency and 1 / its bottleneck, plus, on a GPU
    topology, the protocol's latency per step (by the route's slowest class of link) and its
    wire bytes per payload byte."""
    alpha, beta = topology.path_alpha_beta(a, b)
    if protocol is None:
        return alpha, beta
    from .topology.gpu import CLASSES
    channels, _ = topology.route(a, b)
    cls = int(topology.channel_class[channels].max(initial=-1)) if channels else -1
    exposed = topology.gpu is not None and topology.gpu.exposed_network
    beta = beta / protocol.efficiency
    if protocol.name == "ll" and topology.gpu is not None:     # NCCL's LL limit per GPU (payload, each way)
        n = len(topology.workers)
        size = topology.machine_size(n)
        beta = max(beta, 4 / topology.gpu.ll_limit(n // size if n % size == 0 else 1))
    return alpha + (protocol.step_latency(CLASSES[cls], exposed) if cls >= 0 else 0.0), beta


def _pairs_alpha_beta(topology: Topology, a, b, protocol=None) -> tuple:
    """The slowest of the routes a[i] -> b[i] (names), as ``_alpha_beta`` would give it pair by
    pair and ``max`` would pick (the largest alpha, then beta), from all routes at once."""
    import numpy as np
    index = topology.index
    channels, latency, _ = topology.route_table([index[x] for x in a], [index[x] for x in b])
    used = channels >= 0
    capacity = np.where(used, topology.channel_capacity[np.maximum(channels, 0)], np.inf)
    bottleneck = capacity.min(axis=1, initial=np.inf)
    alpha = np.where(used.any(axis=1), latency, 0.0)
    beta = np.where(used.any(axis=1), 1.0 / bottleneck, 0.0)
    if protocol is not None:
        from .topology.gpu import CLASSES
        exposed = topology.gpu is not None and topology.gpu.exposed_network
        cls = np.where(used, topology.channel_class[np.maximum(channels, 0)], -1).max(axis=1, initial=-1)
        steps = np.array([protocol.step_latency(c, exposed) for c in CLASSES])
        alpha = alpha + np.where(cls >= 0, steps[np.maximum(cls, 0)], 0.0)
        beta = beta / protocol.efficiency
        if protocol.name == "ll" and topology.gpu is not None:
            n = len(topology.workers)
            size = topology.machine_size(n)
            beta = np.maximum(beta, 4 / topology.gpu.ll_limit(n // size if n % size == 0 else 1))
    k = np.lexsort((beta, alpha))[-1]
    return float(alpha[k]), float(beta[k])


def _protocol(topology: Topology, protocol):
    """The ``gpu.Protocol`` the closed forms charge: the topology's default, or ``protocol``."""
    if topology.gpu is None:
        return None
    return topology.gpu.protocol(protocol)


def _switch(topology: Topology, names, workers, protocol) -> dict:
    """Alpha and beta to the switch that reduces (at its share of the link): the one for all
    the workers, else machine 0's; none where the topology has none."""
    from ..errors import ConfigError
    try:
        node = topology.reducer_for(workers, "switch" if workers <= topology.machine_size(workers) or
                                    topology.network_reducer else "switch0")
    except ConfigError:
        return {}
    alpha, beta = _alpha_beta(topology, names[0], node, protocol)
    switch = topology.node(node)
    return dict(switch_alpha=alpha, switch_beta=beta / (switch.switch_reduction or 1.0),
                switch_base=switch.collective_overhead or 0.0)


def net_for(topology: Topology, workers: int, options: dict | None = None, protocol: str | None = None) -> Net:
    """Alpha-beta-gamma parameters of ``topology`` for the first ``workers`` workers; on a GPU
    topology with the costs of ``protocol`` (its default: Simple).

    >>> from gradsync.model.topology import preset
    >>> net_for(preset("pcie-switch-4"), 4).beta * 16e9
    1.0
    >>> n = net_for(preset("hgx-h100"), 8)
    >>> round(n.alpha * 1e6, 1), round(1 / n.beta / 1e9, 1), round(n.base * 1e6, 1)
    (3.4, 370.8, 8.4)
    """
    names = list(topology.workers[:workers])
    proto = _protocol(topology, protocol)

    def ab(a, b):
        return _alpha_beta(topology, a, b, proto)

    def worst(pairs):
        return _pairs_alpha_beta(topology, [a for a, _ in pairs], [b for _, b in pairs], proto)
    # the slowest route between neighbouring workers: on one switch any pair's, across a slow
    # link (two servers) the link's, which bounds every algorithm that crosses it
    pairs = list(zip(names, names[1:] + names[:1])) if workers > 1 else [(names[0], names[0])]
    alpha, beta = worst(pairs)
    rate, madd_rate = topology.reduce_rate(names[0]), topology.madd_rate(names[0])
    gamma = 1.0 / rate if rate else 0.0
    mu = 1.0 / madd_rate if madd_rate else 0.0
    host = {}
    if topology.host is not None:
        host_alpha, host_beta = ab(names[0], topology.host)
        host_rate = topology.reduce_rate(topology.host)
        host = dict(host_alpha=host_alpha, host_beta=host_beta,
                    host_gamma=1.0 / host_rate if host_rate else 0.0)
    local = (options or {}).get("local_size")
    if local and 1 < local < workers and workers % local == 0:
        # across machines: the rails (worker i and i + L); inside: neighbours in one machine
        alpha, beta = worst([(names[i], names[(i + local) % workers]) for i in range(workers)])
        host["local_alpha"], host["local_beta"] = worst([(names[i], names[i + 1]) for i in range(workers - 1)
                                                         if (i + 1) % local])
    ring_betas = ()
    rings = (options or {}).get("rings")
    if rings:
        hops = [[(names[r[i]], names[r[(i + 1) % workers]]) for i in range(workers)] for r in rings]
        ring_betas = tuple(max(ab(a, b)[1] for a, b in ring) for ring in hops)
        alpha = max(ab(a, b)[0] for ring in hops for a, b in ring)
    if topology.reducers or topology.network_reducer:
        host.update(_switch(topology, names, workers, proto))
    return Net(alpha, beta, gamma, mu, ring_betas=ring_betas, base=proto.base if proto else 0.0,
               posted=bool(proto and topology.gpu.eager), **host)


def predict(algorithm: str, topology: Topology, workers: int, nbytes: float, itemsize: int = 4,
            protocol: str | None = None, **options) -> float:
    """Closed-form time of ``algorithm`` all-reducing ``nbytes`` over ``workers`` workers (on a
    GPU topology, moved by ``protocol``: its collective latency ``Net.base`` added).

    >>> from gradsync.model.topology import preset
    >>> round(predict("sharded", preset("pcie-switch-4"), 4, 160e6), 4)
    0.015
    """
    if not options:
        options = default_options(algorithm, topology, workers)
    spec = algorithms.get(algorithm)
    spec.check_options(options)
    net = net_for(topology, workers, options, protocol)
    return spec.cost(workers, nbytes, net, itemsize=itemsize, **options) + (net.base if workers > 1 else 0.0)


TERMS = {"latency": ("alpha", "host_alpha", "local_alpha", "switch_alpha", "switch_base"),
         "bandwidth": ("beta", "host_beta", "ring_betas", "local_beta", "switch_beta"),
         "reduction": ("gamma", "host_gamma"), "codec": ("mu",)}


def terms(algorithm: str, topology: Topology, workers: int, nbytes: float, itemsize: int = 4,
          protocol: str | None = None, **options) -> dict:
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
    net = net_for(topology, workers, options, protocol)
    base = net.base if workers > 1 else 0.0

    def only(kept):
        zeroed = {}
        for f in dataclasses.fields(net):
            value = getattr(net, f.name)
            if f.name in kept or value is None:
                continue
            zeroed[f.name] = tuple(0.0 for _ in value) if isinstance(value, tuple) else 0.0
        return dataclasses.replace(net, **zeroed)

    out = {name: spec.cost(workers, nbytes, only(fields), itemsize=itemsize, **options) for name, fields in TERMS.items()}
    out["latency"] += base                       # the protocol's once-per-collective latency
    out["closed_form"] = spec.cost(workers, nbytes, net, itemsize=itemsize, **options) + base
    out["overlap"] = out["closed_form"] - sum(out[name] for name in TERMS)
    return out
