"""In-switch reduction: the switch adds up what the GPUs send through it (NVLink SHARP on an
NVSwitch, "NVLS"; SHARP on an InfiniBand switch), and multicasts the sum back.

The buffer is pipelined in S segments, each cut into one piece per worker. For segment k:
every worker sends its copy to the switch, which reduces them as they pass (REDUCE into the
helper ``switch``, round k); the switch returns piece j of the sum to worker j (round k + 1),
as NVLS's ld_reduce returns it to the GPU that asked; worker j writes it back (multimem.st,
round k + 2); the switch multicasts the segment to every worker (round k + 3). This is
``nvls_tree.py``'s one-machine case; the helper runs on the topology's switch that reduces
for all the workers (``Topology.reducer_for``).

Cost: every worker's link carries n (1 + 1/N) each way, at the switch's share of the link
(``switch_beta``: NCCL's nvlsEfficiency, 0.85 on Hopper, 0.74 on Blackwell), in S + 3 rounds:
(S + 3) (alpha + n/S (1 + 1/N) beta_switch). Against a ring's 2 (N - 1)/N n through each link,
about half: NCCL's "busbw" for it reads 2 (N - 1)/(N + 1) times the link's rate.

>>> s = schedule(4, 16, segments=1)
>>> s.helpers, s.rounds
(('switch',), 4)
"""

EXPLANATION = """\
The switch between the GPUs does the adding (NVLink SHARP on an NVSwitch; SHARP on an
InfiniBand switch): every GPU sends its gradient into the switch once, the switch adds the
copies as they pass and sends each GPU its share of the sum, which the GPU writes back for the
switch to multicast to everyone. Each GPU's link carries the data once each way, about half
of what a ring puts through it, and no GPU spends time adding. It wins for large messages on
machines whose switch can reduce (H100 and later); the switch's set-up costs tens of
microseconds, so small messages go by ring or tree."""


from ..core.schedule import Schedule
from ._common import Net
from .nvls_tree import build, cost as tree_cost
from .spec import AlgorithmSpec, Option, is_int


def schedule(workers: int, elements: int, segments: int | None = None) -> Schedule:
    """Build the in-switch all-reduce (default segments: 2 MiB per piece, about a million
    transfers at most).

    >>> schedule(8, 100).rounds
    4
    """
    return build("nvls", workers, elements, None, segments, lambda m: "switch")


def cost(workers: int, nbytes: float, net: Net, itemsize: int = 4, segments=None, **options) -> float:
    """Closed-form time (module docstring): ``round(cost(8, 1e9, Net(0, 1 / 370e9, switch_beta=1 / 315e9),
    segments=64) * 1e3, 2)`` is 3.74."""
    return tree_cost(workers, nbytes, net, itemsize, None, segments)


SPEC = AlgorithmSpec(
    name="nvls", schedule=schedule, cost=cost, explanation=EXPLANATION,
    phases={"reduce": "reduce in the switch", "copy": "multicast from the switch"}, exact=True,
    summary="in-switch reduction: the switch adds (NVLink SHARP, SHARP) and multicasts the sum",
    options={"segments": Option(None, "an integer >= 1 (segments per piece)", is_int(1))},
    needs=("switch",))
