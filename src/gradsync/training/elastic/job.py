"""An elastic job's configuration: the run directory's files and what elastic training refuses
before anything starts.

The run directory, shared by the launcher and every worker, holds ``config.json`` (the
``TrainConfig``), the checkpoint, ``progress.json`` (the last committed step),
``events.jsonl`` (one line per group formed) and, at the end, ``done.json``.

>>> check(3, TrainConfig(), min_workers=2, kill_every=None) is None
True
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from ... import algorithms
from ...errors import ConfigError
from ..train import TrainConfig

CHECKPOINT = "checkpoint.pt"
# torchrun's rendezvous settings that re-form a group in seconds instead of about 47 s: close a
# round 2 s after its last arrival, and call an agent dead after 3 missed 1 s heartbeats
FAST_RENDEZVOUS = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def check(workers: int, cfg: TrainConfig, min_workers: int, kill_every: float | None) -> None:
    """Refuse what elastic training cannot do, before anything starts.

    Example: ``check(3, TrainConfig(algorithm="cerar"), 2, None)`` raises ConfigError (an
    exact algorithm is needed).
    """
    cfg.check(workers)
    if cfg.transport == "shm":
        raise ConfigError("elastic training runs over Gloo (transport 'auto' or 'gloo'), got transport 'shm': a "
                          "restart re-forms the group, and a shared segment's set-up would outlive its attempt")
    if cfg.algorithm not in algorithms.names(exact=True):
        raise ConfigError(f"--elastic needs an exact algorithm ({', '.join(algorithms.names(exact=True))}), got "
                          f"{cfg.algorithm!r}: recovery checks that replicas are bit-identical")
    if cfg.resync_every:
        raise ConfigError("--resync-every is a remedy for CERAR's drift; --elastic runs exact algorithms only")
    if not isinstance(min_workers, int) or not 1 <= min_workers <= workers:
        raise ConfigError(f"min_workers must be an integer in 1..{workers}, got {min_workers!r}")
    if kill_every is not None and (kill_every <= 0 or min_workers == workers):
        raise ConfigError(f"kill_every needs a positive number of seconds and min_workers < workers, got "
                          f"{kill_every!r} with min_workers {min_workers}")


def over_gloo(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as elastic training runs it: "auto" means Gloo here (every restart re-forms Gloo's
    group from the agent's store, which outlives the attempts).

    >>> over_gloo(TrainConfig()).transport
    'gloo'
    """
    return dataclasses.replace(cfg, transport="gloo") if cfg.transport == "auto" else cfg


def workers_per_machine(network) -> int:
    """Workers on each machine: ``network.per_node`` on emulated machines, else 1 (``workers_per_machine(None)``)."""
    return network.per_node if network is not None else 1


def check_machines(workers: int, min_workers: int, network, victims: list[tuple[str, int]] | None) -> int:
    """The number of machines; refuses workers that do not fill the emulated machines, and
    victims that are not ``("machine" | "worker", machine index)``.

    Example: ``check_machines(4, 2, None, [("machine", 3)])`` is 4.
    """
    per_node = workers_per_machine(network)
    if network is not None and (network.workers != workers or min_workers % per_node):
        raise ConfigError(f"on emulated machines of {per_node} workers, workers ({workers}) must be the network's "
                          f"{network.workers} and min_workers ({min_workers}) a multiple of {per_node}")
    machines = workers // per_node
    for kind, machine in victims or ():
        if kind not in ("machine", "worker") or not 0 <= machine < machines:
            raise ConfigError(f"victims are ('machine' | 'worker', index in 0..{machines - 1}), got "
                              f"{(kind, machine)!r}")
    return machines


def read_config(workdir: Path) -> TrainConfig:
    """The run's ``TrainConfig`` from ``workdir/config.json``, ``{"config": {field: value}}`` with
    any of TrainConfig's fields (the others keep their defaults), checked before training.

    Example: ``{"config": {"algorithm": "hierarchical", "epochs": 20, "model": "cnn"}}``.
    """
    path = Path(workdir) / "config.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read it as JSON ({e})") from None
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    given = spec.get("config") if isinstance(spec, dict) else None
    if not isinstance(given, dict):
        raise ConfigError(f'{path}: expected {{"config": {{field: value, ...}}}}, got {str(spec)[:80]!r}')
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(map(repr, unknown))}; TrainConfig has "
                          f"{', '.join(sorted(known))}")
    cfg = TrainConfig(**given)
    workers = int(os.environ.get("WORLD_SIZE", 1))
    check(workers, cfg, workers, None)
    return cfg


def prepare_run_directory(workdir: str | None, cfg: TrainConfig) -> Path:
    """The run directory (a fresh temporary one if ``workdir`` is None), emptied of an earlier
    run's state and holding ``cfg`` as ``config.json``.

    Example: ``prepare_run_directory("/tmp/run", TrainConfig(epochs=2))`` is Path("/tmp/run").
    """
    work = Path(tempfile.mkdtemp(prefix="gradsync-elastic-") if workdir is None else workdir)
    work.mkdir(parents=True, exist_ok=True)
    for stale in (CHECKPOINT, "done.json", "progress.json", "events.jsonl"):
        (work / stale).unlink(missing_ok=True)
    for partial in work.glob("*.tmp*"):          # writes cut short by an earlier kill
        partial.unlink()
    (work / "config.json").write_text(json.dumps({"config": asdict(cfg)}))
    return work
