"""``train``: an elastic run from this process, one torchrun agent per machine, with an
optional fault drill that kills machines or workers while the job trains, and the run's
result read back from its directory.

>>> kill = {"at": 10.0, "returned": 13.0}
>>> _recovery_times(kill, [{"time": 12.5, "world_size": 2}, {"time": 15.0, "world_size": 3}], workers=3)
>>> kill
{'recovered_s': 2.5, 'admitted_s': 2.0}
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...errors import GradsyncError
from ..train import TrainConfig
from .agents import Agents, RendezvousStore
from .job import CHECKPOINT, check, check_machines, over_gloo, prepare_run_directory, workers_per_machine


def train(workers: int, cfg: TrainConfig, min_workers: int | None = None, kill_every: float | None = None,
          max_kills: int | None = None, rejoin_after: float | None = 3.0, seed: int = 0, timeout: float = 1800.0,
          workdir: str | None = None, network=None, victims: list[tuple[str, int]] | None = None) -> dict:
    """Train on ``workers`` workers, one torchrun agent per machine; with ``kill_every``, a
    fault drill kills every that many seconds of running training (at most ``max_kills``
    times) and starts a lost machine's agent again ``rejoin_after`` seconds later, once the
    survivors train on their own (never if None).

    Without ``network`` every worker is a machine of its own on this host's loopback; with a
    ``SlowLinks`` (``network.per_node`` workers per emulated machine) the agents run on the
    emulated machines and meet at a ``gradsync store`` on the switch, outside every machine, as
    docs/multinode.md recommends. The drill's victims are random machines, or ``victims`` in
    turn: ``("machine", i)`` kills machine i's agent and workers, ``("worker", i)`` one worker
    process of machine i (its agent restarts it). Each kill reports ``recovered_s`` (from the
    kill to the next group training) and, for a machine, ``admitted_s`` (from its return to a
    full group training). The checkpoint and the agents' logs stay in ``workdir`` if one is given.

    Example::

        result = train(3, TrainConfig(epochs=2), min_workers=2, kill_every=10)
        result["final"]["step"], result["kills"][0]["recovered_s"]
    """
    min_workers = workers if min_workers is None else min_workers
    cfg = over_gloo(cfg)
    check(workers, cfg, min_workers, kill_every)
    machines = check_machines(workers, min_workers, network, victims)
    if victims is not None:
        max_kills = len(victims) if max_kills is None else min(max_kills, len(victims))
    work = prepare_run_directory(workdir, cfg)
    # the rendezvous store lives outside every machine the drill may kill
    store = RendezvousStore(network)
    agents = Agents(work, machines, min_workers // workers_per_machine(network), store.endpoint, max_restarts=1000,
                    network=network)
    drill = _Drill(work, agents, workers, workers_per_machine(network), kill_every, max_kills, rejoin_after,
                   victims, seed)
    try:
        for machine in range(machines):
            agents.start(machine)
        _supervise(work, agents, drill, timeout)
        elapsed = time.monotonic() - drill.start
    finally:
        agents.close(grace=30.0)
        store.close()
    result = {"workers": workers, "machines": machines, "min_workers": min_workers, "config": asdict(cfg),
              "elapsed_s": elapsed, **_outcome(work, drill.kills, workers)}
    if workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return result


class _Drill:
    """The fault drill of one run: every ``kill_every`` seconds of running training (never if
    None), at most ``max_kills`` times, kill a victim, and bring a lost machine back
    ``rejoin_after`` seconds later (never if None). ``kills`` lists what it did."""

    def __init__(self, work: Path, agents: Agents, workers: int, per_node: int, kill_every: float | None,
                 max_kills: int | None, rejoin_after: float | None, victims: list | None, seed: int):
        self.work, self.agents, self.workers, self.per_node = work, agents, workers, per_node
        self.kill_every, self.max_kills, self.rejoin_after, self.victims = kill_every, max_kills, rejoin_after, victims
        self.kills, self.rng, self.start = [], random.Random(seed), time.monotonic()
        self.stop = threading.Event()
        self.next_kill = self.start + kill_every if kill_every else None
        self.last_kill = 0.0

    def due(self, now: float) -> bool:
        return (self.next_kill is not None and now >= self.next_kill
                and (self.max_kills is None or len(self.kills) < self.max_kills))

    def strike(self, now: float) -> None:
        """Kill the next victim, if a full group is training now (else try again later)."""
        step = _running(self.work, self.workers, since=self.last_kill)
        if step is None or len(self.agents.alive()) != self.agents.machines:
            return
        if self.victims:
            kind, victim = self.victims[len(self.kills)]
        else:
            kind, victim = "machine", self.rng.choice(self.agents.alive())
        kill = {"time_s": now - self.start, "kind": kind, "machine": victim, "step": step}
        if kind == "worker":
            self.agents.kill_worker(victim, local_rank=self.per_node - 1)
            kill["at"] = self.last_kill = time.time()
        else:
            self.agents.kill(victim)
            kill["at"] = self.last_kill = time.time()
            if self.rejoin_after is not None:
                self._bring_back(victim, kill)
        self.kills.append(kill)
        self.next_kill = time.monotonic() + self.kill_every

    def _bring_back(self, machine: int, kill: dict) -> None:
        # back after rejoin_after, and not before the survivors train alone
        # (on loaded cores their restart can outlast any fixed delay)
        self.stop.wait(self.rejoin_after)
        _wait_for(lambda: _running(self.work, self.workers - self.per_node, since=kill["at"]) is not None
                  or (self.work / "done.json").exists(), self.stop, limit=120.0)
        self.agents.start(machine)                     # the machine comes back
        kill["returned"] = time.time()


def _supervise(work: Path, agents: Agents, drill: _Drill, timeout: float) -> None:
    """Watch the agents until the job is done, letting the drill strike when it is due."""
    while not (work / "done.json").exists():
        if not agents.alive():
            raise GradsyncError(f"elastic training stopped: every agent exited ({agents.tail_of_logs()})")
        if time.monotonic() - drill.start > timeout:
            raise GradsyncError(f"elastic training did not finish within {timeout:.0f} s "
                                f"({agents.tail_of_logs()})")
        now = time.monotonic()
        if drill.due(now):
            drill.strike(now)
        drill.stop.wait(0.2)


def _running(workdir: Path, workers: int, since: float) -> int | None:
    """The committed step if a full group formed after ``since`` (time.time()) is training
    (it has committed a step since it started), else None: the drill kills only then, since a
    kill inside torchrun's rendezvous can stall the agents' rank assignment (a store timeout)."""
    try:
        last = json.loads((workdir / "events.jsonl").read_text().splitlines()[-1])
        step = json.loads((workdir / "progress.json").read_text())["step"]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    full = last["world_size"] == workers and last["time"] > since
    return step if full and step > last["step"] else None


def _wait_for(condition, stop: threading.Event, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        stop.wait(0.2)


def _outcome(work: Path, kills: list[dict], workers: int) -> dict:
    """What the run directory says of a finished run: the final state, every group formed, the
    kills with their recovery times, the history; times from the first group's start."""
    done = json.loads((work / "done.json").read_text())
    state = torch.load(work / CHECKPOINT, weights_only=True)
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    for kill in kills:
        _recovery_times(kill, events, workers)
    t0 = events[0]["time"] if events else 0.0
    for e in events + state["history"]:
        e["time"] = round(e["time"] - t0, 3)
    return {"history": state["history"], "events": events, "kills": kills, "final": done,
            "restarts": len(events) - 1}


def _recovery_times(kill: dict, events: list[dict], workers: int) -> None:
    """Add to ``kill`` how long the job took to train again, and to admit the returned machine."""
    at, returned = kill.pop("at"), kill.pop("returned", None)
    again = [e["time"] for e in events if e["time"] > at]
    kill["recovered_s"] = round(again[0] - at, 3) if again else None
    if returned is not None:
        full = [e["time"] for e in events if e["time"] > returned and e["world_size"] == workers]
        kill["admitted_s"] = round(full[0] - returned, 3) if full else None
