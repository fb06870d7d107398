"""Where the live view draws each node and how each link bends, per topology.

A drawing must not lie about paths: a helper (CPU, switch, NIC) is never placed on the line
between two nodes it does not connect, so a packet that does not pass through it is never
seen passing through it. Coordinates are in the unit square; ``bend`` is the offset of a
link's curve control point, as a fraction of its length, to the left of a -> b.
"""

from __future__ import annotations

import math

from ..model.topology import Topology


def _circle(count: int, radius: float, start: float = -math.pi / 2, span: float = 2 * math.pi,
            centre=(0.5, 0.5)) -> list[tuple[float, float]]:
    step = span / count if span >= 2 * math.pi - 1e-9 else span / max(count - 1, 1)
    return [(centre[0] + radius * math.cos(start + k * step), centre[1] + radius * math.sin(start + k * step))
            for k in range(count)]


def _row(count: int, y: float, left: float = 0.08, right: float = 0.92) -> list[tuple[float, float]]:
    if count == 1:
        return [((left + right) / 2, y)]
    return [(left + (right - left) * k / (count - 1), y) for k in range(count)]


def _star(topo: Topology) -> dict[str, tuple[float, float]]:
    """One switch in the centre; workers and the host on a circle around it, the host in a
    gap of its own at the top, so no worker-switch spoke passes through it."""
    workers = list(topo.workers)
    hubs = [n.name for n in topo.nodes if n.kind in ("switch", "nic")]
    rest = [n.name for n in topo.nodes if n.name not in workers and n.name not in hubs]
    slots = len(workers) + len(rest)
    spots = _circle(slots, 0.42, start=-math.pi / 2)
    pos = {name: spots[k] for k, name in enumerate(rest)}
    pos.update({name: spots[len(rest) + k] for k, name in enumerate(workers)})
    pos.update({name: (0.5, 0.5) if k == 0 else _circle(len(hubs), 0.15)[k] for k, name in enumerate(hubs)})
    return pos


def _ring(topo: Topology) -> dict[str, tuple[float, float]]:
    """Workers on a circle in ring order; everything else at the centre."""
    pos = dict(zip(topo.workers, _circle(len(topo.workers), 0.42)))
    others = [n.name for n in topo.nodes if n.name not in pos]
    pos.update({name: (0.5, 0.5) if len(others) == 1 else p for name, p in zip(others, _circle(len(others), 0.12))})
    return pos


def _cube_mesh(topo: Topology) -> dict[str, tuple[float, float]]:
    """The hybrid cube-mesh drawing of an 8-GPU NVLink server (as NVIDIA draws the DGX-1):
    two fully connected quads side by side, mirrored, so that GPU i and GPU i + 4 face each
    other; the PCIe switches above and below, one CPU at each side."""
    pos = {"gpu0": (0.20, 0.32), "gpu1": (0.42, 0.32), "gpu2": (0.20, 0.68), "gpu3": (0.42, 0.68),
           "gpu5": (0.58, 0.32), "gpu4": (0.80, 0.32), "gpu7": (0.58, 0.68), "gpu6": (0.80, 0.68),
           "pcie0": (0.28, 0.07), "pcie1": (0.28, 0.93), "pcie2": (0.72, 0.07), "pcie3": (0.72, 0.93),
           "cpu0": (0.03, 0.5), "cpu1": (0.97, 0.5)}
    return pos


def _two_boards(topo: Topology) -> dict[str, tuple[float, float]]:
    """A 16-GPU NVSwitch server drawn as its two baseboards of 8 GPUs, the NVSwitch fabric
    between them and the PCIe tree to the CPU at the side."""
    gpus = [n.name for n in topo.nodes if n.kind == "gpu"]      # all of them, workers or not
    half = (len(gpus) + 1) // 2
    pos = dict(zip(gpus[:half], _row(half, 0.22, 0.16, 0.94)))
    pos.update(zip(gpus[half:], _row(len(gpus) - half, 0.78, 0.16, 0.94)))
    pos.update({"nvswitch": (0.55, 0.5), "pcie": (0.04, 0.5), "cpu": (0.04, 0.9)})
    return pos


def _cluster(topo: Topology) -> dict[str, tuple[float, float]]:
    """Servers side by side, each a PCIe switch over its GPUs and a NIC above; the network
    switch and the parameter server on top."""
    servers = sorted({n.name.split("-")[0] for n in topo.nodes if "-" in n.name})
    pos = {"switch": (0.5, 0.2), "ps": (0.5, 0.04)}
    for k, server in enumerate(servers):
        x0, x1 = k / len(servers) + 0.03, (k + 1) / len(servers) - 0.03
        mid = (x0 + x1) / 2
        pos[f"{server}-nic"] = (mid, 0.42)
        pos[f"{server}-pcie"] = (mid, 0.6)
        gpus = [n.name for n in topo.nodes if n.name.startswith(server + "-gpu")]
        pos.update(zip(gpus, _row(len(gpus), 0.8, x0 + 0.04, x1 - 0.04)))
    return pos


LAYOUTS = {"ring": _ring, "pcie-switch-4": _star, "ethernet": _star, "p3.16xlarge": _cube_mesh,
           "dgx-2": _two_boards, "lowbw-cluster": _cluster}
# drawings of boards and racks, which may stretch to fill a wide or tall canvas; the others (a
# ring, a star) keep their aspect, so a circle stays a circle
FILLS = ("p3.16xlarge", "dgx-2", "lowbw-cluster")


def fills(preset: str) -> bool:
    """Whether the preset's drawing may stretch to its canvas: ``fills("ring")`` is False."""
    return preset in FILLS
BENDS = {"p3.16xlarge": {("gpu0", "gpu4"): -0.28, ("gpu2", "gpu6"): 0.28}}   # arcs outwards, over the quads


def layout(preset: str, topo: Topology) -> tuple[list[tuple[float, float]], list[float]]:
    """Node positions (in ``topo.nodes`` order) and each link's bend, for the preset's drawing.

    >>> from gradsync.model.topology import preset
    >>> pos, bends = layout("pcie-switch-4", preset("pcie-switch-4"))
    >>> [tuple(round(v, 2) for v in p) for p in pos][-2:]       # the CPU on top, the switch in the middle
    [(0.5, 0.08), (0.5, 0.5)]
    """
    pos = LAYOUTS.get(preset, _ring)(topo)
    fallback = dict(zip([n.name for n in topo.nodes], _circle(len(topo.nodes), 0.42)))
    points = [pos.get(n.name, fallback[n.name]) for n in topo.nodes]
    bends = BENDS.get(preset, {})
    out = []
    for link in topo.links:
        b = bends.get((link.a, link.b))
        out.append(b if b is not None else -bends.get((link.b, link.a), 0.0))
    return points, out
