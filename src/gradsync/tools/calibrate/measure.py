"""What each rank of a calibration runs and times: these functions run in the launched
processes (``launch.run`` starts them by name, so they stay at module level), and rank 0
returns every rank's measurements (times: the slowest rank's; rates: the lowest). How they
are fitted is in ``fitting``.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ...runtime.api import all_reduce
from ..bench import time_in_blocks
from .fitting import fit

LARGE_BYTES = 32 << 20
FIT_BYTES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
CODEC_ELEMENTS = 1 << 22      # 16 MB of float32


def _median_time(fn, repeats, barrier=True):
    times = []
    for _ in range(repeats + 1):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def codec_madd_rate(rank: int, workers: int, repeats: int, elements: int = CODEC_ELEMENTS) -> float:
    """Multiply-adds per second of CERAR's codec as the runtime runs it: each round's packet
    encoded piece by piece (matrix-vector products over the pieces), then the decode, on every
    rank at once. A bare GEMM ran about 3x faster than this mix, and the simulator's CERAR
    rows came out 45-70% short of the measured times.

    >>> codec_madd_rate(0, 2, 3, elements=1 << 12) > 0
    True
    """
    from ...coding import cerar
    from ...runtime.compile import compiled

    c = compiled("cerar", max(workers, 2), elements, "float32", "{}", rank % max(workers, 2))
    schedule, design = c.schedule, c.design
    flat = torch.randn(elements)

    def codec():             # what the collective does between its transfers: the plan's pieces
        w = cerar.Worker(design, rank, flat)
        for send in c.plan.sends:
            w.packet(send.round, send.offset, send.offset + send.count)
        for t in range(1, design.rounds + 1):
            w.received(t)
        w.result()
    madds = schedule.compute["madds"][schedule.compute["node"] == rank].sum()    # the simulator's count
    return float(madds) / _median_time(codec, repeats, barrier=False)


P2P_BYTES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)
LINK_SECONDS = 0.5            # on emulated links, time messages up to this long on the wire
AGREEMENT_ELEMENTS = 1024     # a ring all-reduce this small is all fixed costs


def sizes_for(sizes, max_bytes: float | None) -> tuple[int, ...]:
    """The message sizes to measure on links of a limited rate: those of ``sizes`` up to
    ``max_bytes``, and never fewer than the smallest three (a line needs three points).

    >>> sizes_for((1, 10, 100, 1000), 150), sizes_for((1, 10, 100, 1000), 5), sizes_for((1, 10), None)
    ((1, 10, 100), (1, 10, 100), (1, 10))
    """
    if max_bytes is None:
        return tuple(sizes)
    return tuple(n for i, n in enumerate(sizes) if n <= max_bytes or i < 3)


def link_max_bytes(rate_Bps: float) -> float:
    """The largest message worth timing on a link of ``rate_Bps``: half a second's worth, so
    that a calibration on 100 Mbit/s links takes minutes, not an hour (``link_max_bytes(12.5e6)``
    is 6.25 MB)."""
    return rate_Bps * LINK_SECONDS


def p2p_times(rank: int, workers: int, repeats: int, sizes=P2P_BYTES) -> dict:
    """This rank's median seconds per call of: k workers (1..k) sending n bytes each to
    worker 0 at once, for k = 1..N-1 (``("fan", k, n)``), and workers 0 and 1 exchanging n
    bytes (``("swap", n)``), and with 4 or more workers, 0 -> 1 and 2 -> 3 at once (``("pairs",
    n)``: do disjoint transfers share a limit?), n in ``sizes``. Ranks outside a case return
    at once."""
    send = {n: torch.ones(n // 4) for n in sizes}
    recv = {n: [torch.empty(n // 4) for _ in range(workers)] for n in sizes}
    calls = {}
    for n in sizes:
        for k in range(1, workers):
            def fan(n=n, k=k):
                if rank == 0:
                    for req in [dist.irecv(recv[n][src], src) for src in range(1, k + 1)]:
                        req.wait()
                elif rank <= k:
                    dist.send(send[n], 0)
            calls[("fan", k, n)] = fan

        def swap(n=n):
            if rank < 2:
                peer = 1 - rank
                got = dist.irecv(recv[n][peer], peer)
                dist.isend(send[n], peer).wait()
                got.wait()
        calls[("swap", n)] = swap

        def pairs(n=n):
            if rank in (0, 2):
                dist.send(send[n], rank + 1)
            elif rank in (1, 3):
                dist.recv(recv[n][rank - 1], rank - 1)
        if workers >= 4:
            calls[("pairs", n)] = pairs
    samples = time_in_blocks(calls, repeats, dist.barrier)
    return {key: statistics.median(v) for key, v in samples.items()}


def _local_rates(rank: int, workers: int, repeats: int) -> tuple[float, float]:
    """This rank's adds per second and CERAR codec multiply-adds per second, every rank at once."""
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    add_rate = a.numel() / _median_time(lambda: a.add_(b), repeats, barrier=False)
    return add_rate, codec_madd_rate(rank, workers, repeats)


def add_seconds_alone(rank: int, repeats: int) -> float:
    """Seconds per element of rank 0's adds while the other ranks wait (0.0 on them): with more
    processes than cores, a rank adding alone (central's root) runs several times faster than
    every rank adding at once (a ring round)."""
    a, b = torch.randn(LARGE_BYTES // 4), torch.randn(LARGE_BYTES // 4)
    dist.barrier()
    seconds = _median_time(lambda: a.add_(b), repeats, barrier=False) / a.numel() if rank == 0 else 0.0
    dist.barrier()
    return seconds


def _ring_times(repeats: int, size: int, group=None, sizes=FIT_BYTES) -> list[float]:
    """Median seconds of the ring all-reduce at each of ``sizes`` over ``group`` (``size`` ranks)."""
    bufs = [torch.randn(nbytes // 4) for nbytes in sizes]
    calls = {k: (lambda buf=buf: all_reduce(buf, group=group, check=False)) for k, buf in enumerate(bufs)}
    samples = time_in_blocks(calls, repeats, lambda: dist.barrier(group=group),
                             before=lambda k: bufs[k].div_(size))           # stays finite
    return [statistics.median(samples[k]) for k in range(len(bufs))]


def agreement_times(repeats: int) -> tuple[float, float]:
    """Median seconds of a small ring all-reduce (AGREEMENT_ELEMENTS floats) with the ranks'
    agreement on the call (``check``, the default) and without: their difference is what the
    agreement adds to every collective, which no schedule describes."""
    x = torch.ones(AGREEMENT_ELEMENTS)
    calls = {"checked": lambda: all_reduce(x, check=True), "unchecked": lambda: all_reduce(x, check=False)}
    samples = time_in_blocks(calls, 2 * repeats, dist.barrier, before=lambda name: x.fill_(1.0))
    return statistics.median(samples["checked"]), statistics.median(samples["unchecked"])


def worker(rank: int, workers: int, repeats: int, max_bytes: float | None = None) -> dict | None:
    """One rank's measurements, messages up to ``max_bytes`` (``sizes_for``); rank 0 returns
    them for every rank (times: the slowest rank's; rates: the lowest)."""
    torch.set_num_threads(1)
    ring_sizes, p2p_sizes = sizes_for(FIT_BYTES, max_bytes), sizes_for(P2P_BYTES, max_bytes)
    add_rate, madd_rate = _local_rates(rank, workers, repeats)
    times = _ring_times(repeats, workers, sizes=ring_sizes)
    p2p = p2p_times(rank, workers, repeats, p2p_sizes)
    agreement = agreement_times(repeats)
    alone = add_seconds_alone(rank, repeats)
    keys = sorted(p2p, key=str)
    stats = torch.tensor(times + [p2p[k] for k in keys] + [alone] + list(agreement) + [-add_rate, -madd_rate],
                         dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank:
        return None
    p2p = dict(zip(keys, stats[len(times):-5].tolist()))
    return {"sizes": list(ring_sizes), "times": stats[:len(times)].tolist(), "add_rate": -stats[-2].item(),
            "madd_rate": -stats[-1].item(), "agreement_s": stats[-4:-2].tolist(),
            "add_rate_alone": 1 / stats[-5].item(),
            "fan_in_s": {f"{k}x{n}": p2p[("fan", k, n)] for k in range(1, workers) for n in p2p_sizes},
            "exchange_s": {str(n): p2p[("swap", n)] for n in p2p_sizes},
            "pairs_s": {str(n): p2p[("pairs", n)] for n in p2p_sizes if ("pairs", n) in p2p}}


# ---------------------------------------------------------------- several machines

def machines_worker(rank: int, workers: int, repeats: int, local: int) -> dict | None:
    """One rank of a calibration across machines of ``local`` consecutive ranks: the ring
    all-reduce timed inside each machine (every machine's ranks at once: they share no link)
    and across machines (local rank 0 of each, the others idle, so one flow per direction has
    each machine's network link), each fitted as ``fit`` does. Rank 0 returns both fits."""
    torch.set_num_threads(1)
    machines = workers // local
    inside = [dist.new_group(list(range(m * local, (m + 1) * local))) for m in range(machines)]
    across = dist.new_group([m * local for m in range(machines)])        # every rank creates every group
    add_rate, madd_rate = _local_rates(rank, workers, repeats)
    times = torch.zeros(2, len(FIT_BYTES), dtype=torch.float64)
    for level, group, size, member in ((0, inside[rank // local], local, True),
                                       (1, across, machines, rank % local == 0)):
        dist.barrier()
        if member:
            times[level] = torch.tensor(_ring_times(repeats, size, group))
    stats = torch.cat([times.flatten(), torch.tensor([-add_rate, -madd_rate], dtype=torch.float64)])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank:
        return None
    add_rate, madd_rate = -stats[-2].item(), -stats[-1].item()
    level_times = stats[:-2].view(2, -1).tolist()
    return {"machines": machines, "local_size": local,
            "inside": fit(local, list(FIT_BYTES), level_times[0], add_rate, madd_rate),
            "across": fit(machines, list(FIT_BYTES), level_times[1], add_rate, madd_rate)}
