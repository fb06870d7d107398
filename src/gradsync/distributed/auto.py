"""``auto`` for the gradsync backend: gradsync's schedule or the engine's own collective, per size,
as measured on this machine. Never slower than the engine: the engine is a candidate, and a
schedule is chosen at a size only where it took at most ``MARGIN`` of the engine's time.

At a group's first ``auto`` use of a collective, every rank times the engine and a few
schedules at ``SIZES`` (the slowest rank's time counts; sizes stop once ``budget()`` seconds
are spent, larger ones take the largest verdict) and keeps the verdict in the group. The
verdicts are cached per host in a JSON file (``cache_path()``: GRADSYNC_AUTO_CACHE, else
~/.cache/gradsync/backend-auto.json), keyed by collective, group size, ranks per host and
torch version and transport; the next job on the host reads them instead of measuring. Rank 0's verdicts
are broadcast, so every rank chooses alike. GRADSYNC_AUTO_BUDGET=0 turns measuring off
(``auto`` is then the engine, unless the cache says otherwise).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

SIZES = (4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20)     # bytes
MARGIN = 0.95          # a schedule must take at most this fraction of the engine's time
DEFAULT_BUDGET = 2.0   # seconds of measuring per collective and group, once per host (cached): 16 MB fits
ENV_CACHE, ENV_BUDGET = "GRADSYNC_AUTO_CACHE", "GRADSYNC_AUTO_BUDGET"
METHOD = "median-interleaved-after-barrier"     # how verdicts are measured: a cached one measured otherwise is not reused
ENGINE_ONLY = ("broadcast", "barrier")       # one-off or tiny: measuring would cost more than it saves


def cache_path() -> Path:
    """Where verdicts are cached: GRADSYNC_AUTO_CACHE, else ~/.cache/gradsync/backend-auto.json.

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


def candidates(kind: str, workers: int, shared: bool = False, local: int | None = None) -> list[str]:
    """What ``auto`` times against the engine for ``kind`` on ``workers`` ranks: two schedules,
    where the ranks share memory (``shared``) the shared-buffer collectives instead of the
    second, and where they span hosts of ``local`` ranks each (1 < local < workers) the
    hierarchical schedule too (inside each host first, then across).

    >>> candidates("reduce_scatter", 3), candidates("all_reduce", 4), candidates("all_reduce", 4, local=2)
    (['ring', 'sharded'], ['ring', 'halving_doubling'], ['ring', 'halving_doubling', 'hierarchical'])
    """
    from .config import one_host_available

    if shared and one_host_available():
        return ["ring", "one_host"]
    power_of_two = workers & (workers - 1) == 0
    out = ["ring", "halving_doubling" if power_of_two else ("sharded" if kind != "all_reduce" else "tree")]
    if local is not None and 1 < local < workers:
        out.append("hierarchical")
    return out


def bucket(nbytes: int, measured: int) -> int:
    """The index in SIZES nearest ``nbytes`` on a log scale, among the first ``measured``.

    >>> bucket(5000, 5), bucket(1 << 30, 3)
    (0, 2)
    """
    if nbytes <= 0:
        return 0
    logs = [abs(math.log(nbytes / s)) for s in SIZES[:measured]]
    return logs.index(min(logs))


def choose(group, kind: str, nbytes: int, trial) -> str:
    """"engine" or the algorithm ``auto`` runs ``kind`` of ``nbytes`` with on ``group``.
    ``trial(choice, kind, nbytes) -> seconds`` runs one collective as ``choice`` on every rank.

    Example: ``choose(group, "all_reduce", 1 << 20, trial)`` is "ring", or "engine" where Gloo won.
    """
    if kind in ENGINE_ONLY or group.size() == 1:
        return "engine"
    verdicts = group.auto_verdicts.get(kind)
    if verdicts is None:
        verdicts = group.auto_verdicts[kind] = _verdicts(group, kind, trial)
    return verdicts[bucket(nbytes, len(verdicts))] if verdicts else "engine"


def table(group) -> list[dict]:
    """What ``auto`` has chosen on ``group`` so far, one row per collective and size measured
    ({"collective", "bytes", "choice"}): what ``gradsync explain`` can show for the current group.

    Example, in each rank after a training step: ``table(dist.group.WORLD)[0]["choice"]`` is
    "one_host", "ring", "engine", ...
    """
    return [{"collective": kind, "bytes": SIZES[i], "choice": choice}
            for kind, verdicts in sorted(group.auto_verdicts.items()) for i, choice in enumerate(verdicts)]


def _key(group, kind: str, found) -> str:
    """The cache key of ``kind`` on ``group``: the group's shape as its ranks found it
    (``found``, its host map: hosts and ranks per host, never LOCAL_WORLD_SIZE, which is wrong
    for subgroups), its transport, torch's version and how the verdicts were measured (``METHOD``)."""
    return (f"{kind}|size={group.size()}|hosts={found.hosts}|local={found.local_size()}"
            f"|over={group.schedule_transport()}|torch={torch.__version__}|{METHOD}")


def _verdicts(group, kind: str, trial) -> list[str]:
    """This group's verdict per size: the cached one if every rank has it (rank 0's wins),
    else measured now and cached."""
    from ..runtime.transport.hosts import host_map

    shared, found = group.schedule_transport() == "shm", host_map(group, group.timeout)
    key, names = _key(group, kind, found), ["engine"] + candidates(kind, group.size(), shared, found.local_size())
    cached = _load().get(key)
    usable = cached is not None and all(v in names for v in cached)
    flags = torch.tensor([1 if usable else 0, len(cached) if usable else 0], dtype=torch.int64)
    _engine_reduce(group, flags, dist.ReduceOp.MIN)
    if flags[0] == 1:
        codes = torch.tensor([names.index(v) for v in cached] if usable else [0] * int(flags[1]), dtype=torch.int64)
        codes = codes[:int(flags[1])]
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.engines["cpu"].broadcast([codes], opts).wait()
        return [names[int(c)] for c in codes]
    verdicts = _measure(group, kind, names, trial) if budget() > 0 else []
    if verdicts and os.environ.get("LOCAL_RANK", "0") == "0":
        _save(key, verdicts)          # one writer per host under a launcher: its first local rank
    return verdicts


def _measure(group, kind: str, names: list[str], trial) -> list[str]:
    """Time each of ``names`` at each size (the slowest rank's median); stop before a size that
    would pass the budget. All ranks see the same times, so they stop alike."""
    verdicts, spent, limit = [], 0.0, budget()
    for size in SIZES:
        started = time.monotonic()
        reps = 9 if size <= (256 << 10) else 3
        times = torch.tensor(_timed(trial, names, kind, size, reps) + [0.0], dtype=torch.float64)
        times[-1] = time.monotonic() - started
        _engine_reduce(group, times, dist.ReduceOp.MAX)
        best = min(range(1, len(names)), key=lambda i: times[i])
        verdicts.append(names[best] if times[best] <= MARGIN * times[0] else "engine")
        spent += float(times[-1])
        # the next size is 8x larger: below 256 KB the fixed costs dominate and a size costs
        # about as much as the last; from there on, about 8x as much
        if spent + (8 if size >= (256 << 10) else 2) * float(times[-1]) > limit:
            break
    return verdicts


def _timed(trial, names: list[str], kind: str, size: int, reps: int) -> list[float]:
    """Each name's median seconds over ``reps`` calls, the names taking turns call by call (a
    drift of the machine's load falls on all alike). The median, not the best: a candidate that
    is fast only now and then (Python and the scheduler on shared cores) must not win."""
    for name in names:
        trial(name, kind, size)         # warm: plans compiled, digests agreed, connections made
    times = [[] for _ in names]
    for _ in range(reps):
        for i, name in enumerate(names):
            times[i].append(trial(name, kind, size))
    return [statistics.median(t) for t in times]


def _engine_reduce(group, tensor: torch.Tensor, op) -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    group.engines["cpu"].allreduce([tensor], opts).wait()


def _load() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save(key: str, verdicts: list[str]) -> None:
    """Add this verdict to the host's cache (written whole and renamed: a reader never sees half)."""
    path = cache_path()
    data = _load()
    data[key] = verdicts
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:           # an unwritable cache costs a measurement next time, nothing more
        pass
