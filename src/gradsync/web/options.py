"""The options the live view gives an algorithm: the topology's defaults (its rings, its
machines), the page's CERAR fields, and a tree pipelined by the size.

>>> from gradsync.model.topology import preset
>>> view_options("tree", preset("ring", 4), 4, 160_000_000, None, None)
{'segments': 32}
"""

from __future__ import annotations

from .. import algorithms
from ..errors import ConfigError
from ..model.cost import default_options
from ..model.topology import Topology

TREE_SEGMENTS = 32             # the view's tree pipelines at most this many segments
MAX_COMPONENTS_PER_WORKER = 3  # CERAR designs the view builds: c <= 3N (beyond, designs take seconds)


def tree_segments(nbytes: int) -> int:
    """Tree segments: one per MiB of float32, rounded up to a power of two up to TREE_SEGMENTS
    (six shapes, so the static export carries each once).

    >>> tree_segments(160_000_000), tree_segments(3 << 20), tree_segments(4)
    (32, 4, 1)
    """
    wanted = max(1, -(-(nbytes // 4) // (1 << 18)))
    return min(TREE_SEGMENTS, 1 << (wanted - 1).bit_length())


def view_options(algorithm: str, topo: Topology, n: int, nbytes: int, components, eps) -> dict:
    """Options for ``algorithm`` at ``n`` workers and ``nbytes`` on ``topo`` (module example);
    ``components`` and ``eps`` apply to the algorithms that take them."""
    takes = algorithms.get(algorithm).options
    options = default_options(algorithm, topo, n)
    # the page's fields apply to the algorithms that take them, and are ignored by the others
    options.update({k: v for k, v in (("components", components), ("eps", eps)) if v is not None and k in takes})
    if "segments" in takes:
        options["segments"] = tree_segments(nbytes)
    if "components" in takes:
        c = options.get("components") or 2 * n
        if c > MAX_COMPONENTS_PER_WORKER * n:
            raise ConfigError(f"components must be at most {MAX_COMPONENTS_PER_WORKER} x workers = "
                              f"{MAX_COMPONENTS_PER_WORKER * n} in the view, got {c}")
    if "max_error" in takes:
        options["max_error"] = None      # build refused designs too: the view shows them, in red
    return options
