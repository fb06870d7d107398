"""The one choice: how a group runs a collective of a given size, measured on this machine.

``choose(comm, collective, dtype, nbytes)`` answers "auto" for every caller: the backend's
process group, ``gradsync.all_reduce(algorithm="auto")``, ``gradsync bench --algorithms auto``
and the MPI entry point. The candidates are the engine's own collective (Gloo's, MPI's), the
shared-buffer collectives where every rank shares this host ("one_host"), and gradsync's
schedules over the group's transport (``candidates``). The engine is always a candidate, and
another wins a size only where its median took at most ``MARGIN`` of the engine's: so auto is
never slower than the engine beyond the cost of its own dispatch.

At a group's first call of a collective, every rank times every candidate at ``SIZES`` (the
slowest rank's median counts; the candidates take turns call by call, each call after the
engine's barrier, so the ranks arrive unevenly as they do after their own work), stopping
before a size that would pass ``budget()`` seconds. A size inside the measured range takes the
verdict of the nearest measured size (on a log scale); a larger one is decided by a cost model
fitted to the measurements, time = a + b x bytes per candidate over its largest measured sizes
(the least predicted time wins, the engine on a tie within the margin), not by the nearest
verdict: the rates differ most where nothing was measured.

Across machines the link decides, and a time budget would stop where the link has not yet
begun to count (over 1 Gbit/s a 2 s budget measures up to 256 KiB, where fixed costs and the
machines' noise hide what the bytes cost). There the candidates are only the schedules with
fewer bytes on the busiest machine's link than the engine's ring (``link_bytes``, read off the
schedules), each is timed at a small size (``SMALL``), the engine alone at growing sizes from
``PROBE`` bytes until its bytes dominate (the link's rate as the engine sees it), and then
every candidate again at the largest of ``LARGE`` that this rate lets the remaining budget pay
for: two points per candidate, where the second is the link's (``_measure_across``). Every
size past the small one takes the line through them, so a 4 MiB bucket is decided by what
4 MiB costs on this link, not by the verdict at 32 KiB.

The measurements are cached per host in a JSON file (``cache_path()``: GRADSYNC_AUTO_CACHE, else
~/.cache/gradsync/backend-auto.json), keyed by collective, group size, hosts, ranks per host,
transport, engine and torch version; the next job on the host reads them. Rank 0's copy is
broadcast, so every rank chooses alike. GRADSYNC_AUTO_BUDGET=0 turns measuring off (auto is
then the engine, unless the cache has the group's shape).

Broadcast and barrier are not measured: they take the shared buffers on one host (one copy
through memory against Gloo's loopback TCP) and the engine elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

SIZES = (4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20)     # bytes
MARGIN = 0.95          # a candidate must take at most this fraction of the engine's time
DEFAULT_BUDGET = 2.0   # seconds of measuring per collective and group, once per host (cached)
FIT_POINTS = 3         # the largest measured sizes the cost model is fitted to
ENV_CACHE, ENV_BUDGET = "GRADSYNC_AUTO_CACHE", "GRADSYNC_AUTO_BUDGET"
METHOD = "median-interleaved-after-barrier/times/2"   # what the cache holds; another method's is not reused
SMALL, PROBE = 32 << 10, 512 << 10      # across machines: the fixed costs' size, and the engine's rate probe
LARGE = tuple(1 << k for k in range(18, 26))   # across machines: 256 KiB to 32 MiB, the link's sizes
LARGE_REPS = 5          # calls per candidate at the large size: two candidates can be 15% apart there
ACROSS = "small-and-large-by-link-rate/2"


def cache_path() -> Path:
    """Where measurements are cached: GRADSYNC_AUTO_CACHE, else ~/.cache/gradsync/backend-auto.json.

    >>> cache_path().name.endswith(".json")
    True
    """
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "gradsync" / "backend-auto.json")


def budget() -> float:
    """Seconds a group may spend measuring one collective (GRADSYNC_AUTO_BUDGET, default 2).

    >>> budget() >= 0
    True
    """
    return float(os.environ.get(ENV_BUDGET, DEFAULT_BUDGET))


class Verdicts:
    """What was measured for one collective on one group: the median seconds of each candidate
    at each measured size, and the choice they imply at any size.

    >>> v = Verdicts((4096, 32768), {"engine": [1e-4, 2e-4], "ring": [2e-4, 1e-4]})
    >>> v.pick(4096), v.pick(40000), v.pick(1 << 30)
    ('engine', 'ring', 'ring')
    """

    def __init__(self, sizes: tuple, times: dict[str, list[float]], across: bool = False):
        self.sizes, self.times, self.across = tuple(sizes), times, across
        self.spent = 0.0                   # seconds this process measured for them (0: from the cache)

    def pick(self, nbytes: int) -> str:
        """The candidate for ``nbytes``: the nearest measured size's winner, or past the largest
        measured size (``across``: past the smallest) the least time by each candidate's fitted
        cost model."""
        if not self.sizes:
            return "engine"
        if nbytes > self.sizes[-1 if not self.across else 0] and len(self.sizes) >= 2:
            return _winner(self.predict(nbytes))
        logs = [abs(math.log(max(nbytes, 1) / s)) for s in self.sizes]
        i = logs.index(min(logs))
        return _winner({name: t[i] for name, t in self.times.items()})

    def _model(self, times: list[float]):
        """time = a + b x bytes, least squares over the largest ``FIT_POINTS`` measured sizes."""
        xs, ys = self.sizes[-FIT_POINTS:], times[len(self.sizes) - len(self.sizes[-FIT_POINTS:]):]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var else 0.0
        a = max(0.0, my - b * mx)
        return lambda n: a + b * n

    def predict(self, nbytes: int) -> dict[str, float]:
        """Each candidate's seconds for ``nbytes`` by its fitted cost model.

        >>> Verdicts((1, 3), {"engine": [1.0, 3.0]}).predict(5)
        {'engine': 5.0}
        """
        return {name: self._model(t)(nbytes) for name, t in self.times.items()}

    def table(self, collective: str) -> list[dict]:
        """One row per measured size: its choice and every candidate's median time."""
        return [{"collective": collective, "bytes": size, "choice": self.pick(size), "measured_in": self.spent,
                 "seconds": {name: t[i] for name, t in self.times.items()}} for i, size in enumerate(self.sizes)]


def _winner(times: dict[str, float]) -> str:
    """The fastest candidate if it beats the engine by the margin, else the engine."""
    engine = times.get("engine", math.inf)
    best = min((name for name in times if name != "engine"), key=lambda n: times[n], default="engine")
    return best if best != "engine" and times[best] <= MARGIN * engine else "engine"


def candidates(comm, kind: str) -> list[str]:
    """What auto weighs for ``kind`` on ``comm``'s group, the engine first: on one host the
    shared-buffer collectives and the ring over shared memory; across hosts the schedules that
    carry fewer bytes over the busiest machine's link than the engine's flat ring (``link_bytes``:
    hierarchical where every host holds the same number of consecutive ranks, two or more),
    since a schedule with as many bytes on the link as the engine's ring runs them in Python and
    cannot be faster (measured: ring and halving-doubling lost every size over 2 x 2 machines).

    Example: ``candidates(comm, "all_reduce")`` is ["engine", "one_host", "ring"] on one host.
    """
    from .halves import produces

    workers = comm.size
    if comm.shared() is not None:
        return ["engine", "one_host", "ring"]
    engine = ["engine"] if comm.engine.takes(kind, torch.float32, "sum") else []
    power_of_two = workers & (workers - 1) == 0
    out = ["ring", "halving_doubling" if power_of_two else ("tree" if kind == "all_reduce" else "sharded")]
    found = comm.hosts()
    local = found.local_size()
    if local is not None and 1 < local < workers:
        out.append("hierarchical")
    out = [c for c in out if kind == "all_reduce" or kind in produces(c, workers)]
    if engine and found.hosts > 1:
        flat = link_bytes("ring", found.host)
        out = [c for c in out if link_bytes(c, found.host, local) < MARGIN * flat]
    return engine + out


@lru_cache(maxsize=64)
def link_bytes(algorithm: str, host_of_rank: tuple, local_size: int | None = None) -> float:
    """The most bytes any one host sends or receives over its link in ``algorithm``'s all-reduce
    schedule, per byte of the buffer, where rank r runs on host ``host_of_rank[r]`` (read from
    the schedule itself; the engine's flat ring is "ring").

    >>> link_bytes("ring", (0, 0, 1, 1)), link_bytes("hierarchical", (0, 0, 1, 1), 2)
    (1.5, 1.0)
    """
    from .. import algorithms

    workers = len(host_of_rank)
    options = {"local_size": local_size} if algorithms.get(algorithm).machine_option and local_size else {}
    elements = workers * 1200
    t = algorithms.build(algorithm, workers, elements, **options).transfers
    hosts = np.asarray(host_of_rank + (-1,) * 64)          # helper nodes (past the workers) on no host's link
    src, dst = hosts[t["src"]], hosts[t["dst"]]
    crossing = (src != dst) & (src >= 0) & (dst >= 0)
    count = max(host_of_rank) + 1
    out = np.bincount(src[crossing], weights=t["count"][crossing], minlength=count)
    into = np.bincount(dst[crossing], weights=t["count"][crossing], minlength=count)
    return float(max(out.max(), into.max())) / elements


def choose(comm, kind: str, dtype, nbytes: int) -> str:
    """"engine", "one_host" or the algorithm auto runs ``kind`` of ``nbytes`` with on ``comm``.

    Example: ``choose(comm, "all_reduce", torch.float32, 1 << 20)`` is "one_host" on one host.
    """
    if comm.size == 1:
        return "engine"
    if kind in ("broadcast", "barrier"):
        return "one_host" if comm.shared() is not None else "engine"
    verdicts = comm.verdicts.get(kind)
    if verdicts is None:
        verdicts = comm.verdicts[kind] = _verdicts(comm, kind)
    return verdicts.pick(nbytes)


def table(comm) -> list[dict]:
    """What auto has measured on ``comm``'s group, one row per collective and size."""
    return [row for kind, v in sorted(comm.verdicts.items()) for row in v.table(kind)]


def _key(comm, kind: str) -> str:
    found = comm.hosts()
    method = ACROSS if found.hosts > 1 else METHOD
    return (f"{kind}|size={comm.size}|hosts={found.hosts}|local={found.local_size()}"
            f"|over={comm.schedule_transport()}|engine={comm.engine.name}|torch={torch.__version__}|{method}")


def _verdicts(comm, kind: str) -> Verdicts:
    """This group's measurements: the cached ones if rank 0 has them, else measured now."""
    names = candidates(comm, kind)
    key = _key(comm, kind)
    cached = _load().get(key) if comm.rank == 0 else None
    usable = isinstance(cached, dict) and sorted(cached.get("times", {})) == sorted(names)
    text = json.dumps(cached if usable else None).encode()
    shared = _broadcast_bytes(comm, text)
    found = json.loads(shared.decode())
    across = comm.hosts().hosts > 1
    if found is not None:
        return Verdicts(tuple(found["sizes"]), found["times"], across)
    if names == ["engine"]:                # nothing that could beat it: nothing to measure
        return Verdicts((), {})
    measure = _measure_across if across else _measure
    started = time.monotonic()
    verdicts = measure(comm, kind, names) if budget() > 0 else Verdicts((), {})
    verdicts.spent = time.monotonic() - started
    if verdicts.sizes and comm.rank == 0:
        _save(key, {"sizes": list(verdicts.sizes), "times": verdicts.times})
    return verdicts


def _measure(comm, kind: str, names: list[str]) -> Verdicts:
    """Each candidate's median at each size (the slowest rank's); stop before a size that would
    pass the budget. Every rank sees the same times, so all stop alike."""
    sizes, times, spent, limit = [], {name: [] for name in names}, 0.0, budget()
    for size in SIZES:
        started = time.monotonic()
        medians = _timed(comm, names, kind, size, 9 if size <= (256 << 10) else 3)
        measured = _slowest(comm, medians + [time.monotonic() - started])
        sizes.append(size)
        for i, name in enumerate(names):
            times[name].append(measured[i])
        spent += measured[-1]
        # the next size is 8x larger: below 256 KB the fixed costs dominate and a size costs
        # about as much as the last; from there on, about 8x as much
        if spent + (8 if size >= (256 << 10) else 2) * float(measured[-1]) > limit:
            break
    return Verdicts(tuple(sizes), times)


def _measure_across(comm, kind: str, names: list[str]) -> Verdicts:
    """Across machines: every candidate at ``SMALL``, then the engine alone at growing sizes
    until the link, not its fixed costs, makes most of its time (``_link_rate``), then every
    candidate at the largest of ``LARGE`` whose measuring that rate says fits the rest of the
    budget (no candidate assumed to take over twice the engine's time). Every rank sees the
    same times, so all choose the same size."""
    started, limit = time.monotonic(), budget()
    small = _slowest(comm, _timed(comm, names, kind, SMALL, 5))
    engine = names.index("engine") if "engine" in names else 0
    per_byte = _link_rate(comm, names[engine], kind, small[engine], started + limit / 3)
    left = limit - _slowest(comm, [time.monotonic() - started])[0]
    fits = [size for size in LARGE
            if (1 + LARGE_REPS) * len(names) * (max(small) + 2 * per_byte * size) <= left]   # a warm call, then timed
    large = fits[-1] if fits else LARGE[0]
    times = _slowest(comm, _timed(comm, names, kind, large, LARGE_REPS))
    return Verdicts((SMALL, large), {name: [small[i], times[i]] for i, name in enumerate(names)}, across=True)


def _link_rate(comm, name: str, kind: str, small: float, until: float) -> float:
    """Seconds per byte of ``name``'s ``kind`` past its fixed cost ``small``: timed at 512 KiB,
    then 4x larger, until the time is four times the fixed cost (the bytes dominate) or the
    next size would pass ``until`` (a monotonic time)."""
    size, per_byte = PROBE, 0.0
    while True:
        took = _slowest(comm, _timed(comm, [name], kind, size, 2))[0]
        per_byte = max(took - small, 1e-3 * took) / (size - SMALL)
        if took > 4 * small or size * 4 > LARGE[-1] or time.monotonic() + 3 * 4 * took > until:
            return per_byte
        size *= 4


def _slowest(comm, seconds: list[float]) -> list[float]:
    """The slowest rank's value of each of ``seconds``, on every rank."""
    measured = torch.tensor(seconds, dtype=torch.float64)
    _engine_max(comm, measured)
    return measured.tolist()


def _timed(comm, names: list[str], kind: str, size: int, reps: int) -> list[float]:
    """Each candidate's median seconds over ``reps`` calls, taking turns call by call (a drift of
    the machine's load falls on all alike). The median, not the best: a candidate that is fast
    only now and then must not win."""
    tensors = _trial_tensors(kind, comm.size, size)
    plans = {name: comm._build(kind, name, torch.float32, "sum", True) for name in names}
    for name in names:
        _trial(comm, plans[name], tensors)      # warm: plans compiled, digests agreed, segments mapped
    seconds = [[] for _ in names]
    for _ in range(reps):
        for i, name in enumerate(names):
            seconds[i].append(_trial(comm, plans[name], tensors))
    return [statistics.median(s) for s in seconds]


def _trial_tensors(kind: str, workers: int, nbytes: int) -> tuple:
    n = max(workers, nbytes // 4 // workers * workers)
    full, part = torch.ones(n), torch.ones(n // workers)
    return {"all_reduce": (full,), "reduce_scatter": (part, full), "all_gather": (full, part)}[kind]


def _trial(comm, plan, tensors) -> float:
    comm.engine_wait(comm.engine.barrier(), "choosing (a barrier between trials)")
    started = time.monotonic()
    plan.start(tensors, False)
    return time.monotonic() - started


def _engine_max(comm, tensor: torch.Tensor) -> None:
    comm.engine_wait(comm.engine.all_reduce(tensor, "max"), "choosing (the ranks' times)")


def _broadcast_bytes(comm, data: bytes) -> bytes:
    """Rank 0's ``data`` on every rank (its length first, then its bytes, by the engine)."""
    length = torch.tensor([len(data)], dtype=torch.int64)
    comm.engine_wait(comm.engine.broadcast(length, 0), "choosing (rank 0's measurements)")
    buffer = torch.zeros(int(length[0]), dtype=torch.uint8)
    if comm.rank == 0:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    comm.engine_wait(comm.engine.broadcast(buffer, 0), "choosing (rank 0's measurements)")
    return bytes(buffer.tolist())


def _load() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save(key: str, value: dict) -> None:
    """Add this group's measurements to the host's cache (written whole and renamed)."""
    path = cache_path()
    data = _load()
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:           # an unwritable cache costs a measurement next time, nothing more
        pass
