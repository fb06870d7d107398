"""Elastic data-parallel training on torchrun's elastic agent: lose a worker, keep training.

Each worker is one torchrun "node" (an elastic agent with one process) and all of them meet
in torch.distributed's c10d rendezvous, whose store this launcher hosts, so that no worker's
death takes it down. When a worker dies, the survivors' collective fails with ``PeerError``
(gradsync's bounded-time failure detection), their agents restart them, the rendezvous forms
a new round with the members still alive (at least ``min_workers``), and training continues
from the last committed step. A replacement agent that arrives later is admitted the same
way: the running agents see it waiting and restart into a larger round.

Commit protocol: after each optimizer step, rank 0 writes the model and optimizer state and
the step counter to one checkpoint file, atomically (write, then rename). Every (re)started
worker loads that file, so a step is either in it, and then applied by everyone, or not, and
then redone by everyone from the same state with the same global batch; no update is lost
or applied twice. Ranks then compare the step counter and a SHA-256 of their parameters and
optimizer state (an all_gather of 40 bytes, no pickling), and refuse to train on any
disagreement. The loss is scaled so that the averaged gradient is the global batch's mean
whatever the world size, so the run follows the fault-free trajectory up to float rounding.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from .. import algorithms
from ..errors import ConfigError, GradsyncError
from ..tools.launch import LOOPBACK, rendezvous_store
from . import data, models
from .train import SyncMeter, TrainConfig

CHECKPOINT = "checkpoint.pt"
# torchrun's rendezvous settings that re-form a group in seconds instead of about 47 s: close a
# round 2 s after its last arrival, and call an agent dead after 3 missed 1 s heartbeats
FAST_RENDEZVOUS = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


# ---------------------------------------------------------------- the worker (run by torchrun)

def _state_digest(model, optimizer) -> bytes:
    """SHA-256 of the parameters and the optimizer's momentum buffers, in a fixed order."""
    h = hashlib.sha256(parameters_to_vector(model.parameters()).detach().numpy().tobytes())
    for group in optimizer.param_groups:
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                h.update(buf.detach().contiguous().numpy().tobytes())
    return h.digest()


def _agree(model, optimizer, step: int) -> str:
    """Every rank's step and state digest must match rank 0's; returns the digest (hex)."""
    mine = torch.frombuffer(bytearray(step.to_bytes(8, "little") + _state_digest(model, optimizer)),
                            dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    differ = [r for r, t in enumerate(everyone) if not torch.equal(t, everyone[0])]
    if differ:
        steps = {r: int.from_bytes(bytes(everyone[r][:8].tolist()), "little") for r in [0, *differ]}
        raise GradsyncError(f"replicas disagree after recovery: ranks {differ} differ from rank 0 "
                            f"(steps {steps})")
    return bytes(mine[8:].tolist()).hex()


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _commit(workdir: Path, model, optimizer, step: int, history: list) -> None:
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "history": history}
    _write_atomic(workdir / CHECKPOINT, lambda p: torch.save(state, p))


def _log_event(workdir: Path, event: dict) -> None:
    with open(workdir / "events.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def _evaluate(model, split) -> dict:
    with torch.no_grad():
        return {"train_loss": F.cross_entropy(model(split.x_train), split.y_train).item(),
                "test_accuracy": (model(split.x_test).argmax(1) == split.y_test).float().mean().item()}


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


def worker(workdir: Path) -> None:
    """One rank of an elastic run, started (and restarted) by torchrun's agent."""
    from torch.nn.parallel import DistributedDataParallel

    cfg = read_config(workdir)
    (workdir / "pids").mkdir(exist_ok=True)
    # for the fault drill: which worker processes each agent (its parent) runs
    (workdir / "pids" / f"{os.getppid()}.{os.environ.get('LOCAL_RANK', '0')}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = rendezvous_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, cfg.timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout))
    split = data.digits(cfg.seed)
    model = models.build(cfg.model, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    step, history = 0, []
    if (workdir / CHECKPOINT).exists():
        state = torch.load(workdir / CHECKPOINT, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
    digest = _agree(model, optimizer, step)
    if rank == 0:
        _log_event(workdir, {"time": time.time(), "event": "start", "world_size": world, "step": step,
                             "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), "sha256": digest})
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb, init_sync=False)
    meter = SyncMeter(cfg, rank, world)
    ddp.register_comm_hook(None, meter.hook)
    per_epoch = len(data.batches(len(split.y_train), cfg.batch_size, 0, cfg.seed))
    total = cfg.epochs * per_epoch
    epoch_batches = (None, [])                           # (epoch, its batches): one shuffle per epoch
    while step < total:
        epoch, i = divmod(step, per_epoch)
        if epoch_batches[0] != epoch:
            epoch_batches = (epoch, data.batches(len(split.y_train), cfg.batch_size, epoch, cfg.seed))
        batch = epoch_batches[1][i]
        idx = data.shard(batch, rank, world)
        optimizer.zero_grad()
        # summed, scaled by world / batch: after the hook's average, the global batch's mean
        loss = F.cross_entropy(ddp(split.x_train[idx]), split.y_train[idx], reduction="sum") * (world / len(batch))
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            if step % per_epoch == 0:
                history.append({"epoch": step // per_epoch, "step": step, "world_size": world,
                                "time": time.time(), **_evaluate(model, split)})
            _commit(workdir, model, optimizer, step, history)
            _write_atomic(workdir / "progress.json", lambda p: p.write_text(json.dumps({"step": step,
                                                                                        "total": total})))
    digest = _agree(model, optimizer, step)
    if rank == 0:
        done = {"step": step, "world_size": world, "sha256": digest}
        _write_atomic(workdir / "done.json", lambda p: p.write_text(json.dumps(done)))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher and fault drill

def check(workers: int, cfg: TrainConfig, min_workers: int, kill_every: float | None) -> None:
    """Refuse what elastic training cannot do, before anything starts."""
    cfg.check(workers)
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


class _Nodes:
    """The torchrun agents of one elastic run, one per machine, each in its own session so it
    can be killed whole. On emulated machines (``network``) each agent runs in its machine's
    network namespace under its own host name, with ``network.per_node`` worker processes."""

    def __init__(self, workdir: Path, machines: int, min_machines: int, endpoint: str, max_restarts: int,
                 network=None):
        self.workdir, self.network, self.procs, self.logs = workdir, network, {}, []
        per_node = network.per_node if network is not None else 1
        self.head = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", f"{min_machines}:{machines}",
            "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "gradsync-elastic", "--max-restarts", str(max_restarts), "--monitor-interval", "0.2",
            "--rdzv-conf", "is_host=false,join_timeout=120," + FAST_RENDEZVOUS]
        self.tail = ["-m", "gradsync.training.elastic", str(workdir)]
        self.env = {**os.environ, "OMP_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": network.interface if network is not None else "lo",
                    "LOGLEVEL": os.environ.get("GRADSYNC_AGENT_LOGLEVEL", "WARNING"),
                    # workers' stores on worker rank 0, re-chosen every round: the agents' shared store
                    # would stay on the first rank-0 agent, which may be the one that dies
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def start(self, machine: int) -> None:
        """Start (or restart) the agent of ``machine``."""
        log = open(self.workdir / f"agent{len(self.logs)}.log", "w")
        self.logs.append(log)
        prefix, address = [], LOOPBACK
        if self.network is not None:
            address = self.network.addresses[machine]
            prefix = ["ip", "netns", "exec", self.network.namespaces[machine], "unshare", "--uts", "sh", "-c",
                      f'hostname machine{machine} && exec "$0" "$@"']     # exec all the way: the pid is the agent's
        self.procs[machine] = subprocess.Popen([*prefix, *self.head, "--local-addr", address, *self.tail],
                                               env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)

    def alive(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    def _workers(self, machine: int) -> dict[int, int]:
        """Local rank -> pid of the worker processes the agent of ``machine`` runs now."""
        found = {}
        for f in (self.workdir / "pids").glob(f"{self.procs[machine].pid}.*"):
            try:
                found[int(f.name.split(".")[1])] = int(f.read_text())
            except ValueError:                   # a file being written
                pass
        return found

    def kill(self, machine: int) -> None:
        """SIGKILL the agent of ``machine`` and its workers (a lost machine)."""
        agent = self.procs[machine]
        for pgid in (agent.pid, *self._workers(machine).values()):
            _kill_group(pgid)
        agent.wait()

    def kill_worker(self, machine: int, local_rank: int) -> None:
        """SIGKILL one worker process of ``machine``; its agent stays and restarts it."""
        pid = self._workers(machine).get(local_rank)
        if pid is None:
            raise GradsyncError(f"machine {machine} runs no worker with local rank {local_rank}")
        _kill_group(pid)

    def close(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for i in self.alive():
            try:
                self.procs[i].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(i)
        for log in self.logs:
            log.close()

    def tail_of_logs(self, lines: int = 3) -> str:
        for log in self.logs:
            log.flush()
        texts = [Path(log.name).read_text(errors="replace").strip().splitlines() for log in self.logs]
        errors = [t for text in texts for t in text if "Error" in t or "error" in t]
        return " | ".join(errors[-lines:]) or "no error in the agents' logs"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    check(workers, cfg, min_workers, kill_every)
    per_node = network.per_node if network is not None else 1
    if network is not None and (network.workers != workers or min_workers % per_node):
        raise ConfigError(f"on emulated machines of {per_node} workers, workers ({workers}) must be the network's "
                          f"{network.workers} and min_workers ({min_workers}) a multiple of {per_node}")
    machines = workers // per_node
    if victims is not None:
        for kind, machine in victims:
            if kind not in ("machine", "worker") or not 0 <= machine < machines:
                raise ConfigError(f"victims are ('machine' | 'worker', index in 0..{machines - 1}), got "
                                  f"{(kind, machine)!r}")
        max_kills = len(victims) if max_kills is None else min(max_kills, len(victims))
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="gradsync-elastic-") if own_dir else workdir)
    work.mkdir(parents=True, exist_ok=True)
    for stale in (CHECKPOINT, "done.json", "progress.json", "events.jsonl"):
        (work / stale).unlink(missing_ok=True)
    for partial in work.glob("*.tmp*"):          # writes cut short by an earlier kill
        partial.unlink()
    (work / "config.json").write_text(json.dumps({"config": asdict(cfg)}))
    # the rendezvous store lives outside every machine the drill may kill
    store = _Store(network)
    nodes = _Nodes(work, machines, min_workers // per_node, store.endpoint, max_restarts=1000, network=network)
    kills, rng, start = [], random.Random(seed), time.monotonic()
    stop = threading.Event()
    try:
        for machine in range(machines):
            nodes.start(machine)
        next_kill = start + kill_every if kill_every else None
        last_kill = 0.0
        while not (work / "done.json").exists():
            if not nodes.alive():
                raise GradsyncError(f"elastic training stopped: every agent exited ({nodes.tail_of_logs()})")
            if time.monotonic() - start > timeout:
                raise GradsyncError(f"elastic training did not finish within {timeout:.0f} s "
                                    f"({nodes.tail_of_logs()})")
            now = time.monotonic()
            if next_kill is not None and now >= next_kill and (max_kills is None or len(kills) < max_kills):
                step = _running(work, workers, since=last_kill)
                if step is not None and len(nodes.alive()) == machines:
                    kind, victim = victims[len(kills)] if victims else ("machine", rng.choice(nodes.alive()))
                    kill = {"time_s": now - start, "kind": kind, "machine": victim, "step": step}
                    if kind == "worker":
                        nodes.kill_worker(victim, local_rank=per_node - 1)
                        kill["at"] = last_kill = time.time()
                    else:
                        nodes.kill(victim)
                        kill["at"] = last_kill = time.time()
                        if rejoin_after is not None:
                            # back after rejoin_after, and not before the survivors train alone
                            # (on loaded cores their restart can outlast any fixed delay)
                            stop.wait(rejoin_after)
                            _wait_for(lambda: _running(work, workers - per_node, since=kill["at"]) is not None
                                      or (work / "done.json").exists(), stop, limit=120.0)
                            nodes.start(victim)                     # the machine comes back
                            kill["returned"] = time.time()
                    kills.append(kill)
                    next_kill = time.monotonic() + kill_every
            stop.wait(0.2)
        elapsed = time.monotonic() - start
    finally:
        nodes.close(grace=30.0)
        store.close()
    done = json.loads((work / "done.json").read_text())
    state = torch.load(work / CHECKPOINT, weights_only=True)
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    for kill in kills:
        _recovery_times(kill, events, workers)
    t0 = events[0]["time"] if events else 0.0
    for e in events + state["history"]:
        e["time"] = round(e["time"] - t0, 3)
    result = {"workers": workers, "machines": machines, "min_workers": min_workers, "config": asdict(cfg),
              "elapsed_s": elapsed, "history": state["history"], "events": events, "kills": kills, "final": done,
              "restarts": len(events) - 1}
    if own_dir:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _wait_for(condition, stop: threading.Event, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        stop.wait(0.2)


def _recovery_times(kill: dict, events: list[dict], workers: int) -> None:
    """Add to ``kill`` how long the job took to train again, and to admit the returned machine."""
    at, returned = kill.pop("at"), kill.pop("returned", None)
    again = [e["time"] for e in events if e["time"] > at]
    kill["recovered_s"] = round(again[0] - at, 3) if again else None
    if returned is not None:
        full = [e["time"] for e in events if e["time"] > returned and e["world_size"] == workers]
        kill["admitted_s"] = round(full[0] - returned, 3) if full else None


class _Store:
    """The rendezvous store of a run: in this process on loopback, or, on emulated machines, a
    ``gradsync store`` process on the switch's own address (reachable from every machine)."""

    def __init__(self, network=None):
        self.proc = None
        if network is None:
            self.store = rendezvous_store(LOOPBACK, 0, 0, 1, timeout=60.0)
            self.endpoint = f"{LOOPBACK}:{self.store.port}"
            return
        self.proc = subprocess.Popen(["ip", "netns", "exec", network.switch, sys.executable, "-m", "gradsync", "store",
                                      "--host", network.switch_address, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.proc.kill()
            raise GradsyncError(f"the rendezvous store did not start: {self.proc.stderr.read().strip()[-500:]}")
        self.endpoint = line.split("listening on ")[1].split()[0]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[2] == "--check":     # check DIR/config.json before starting agents
        try:
            print(f"ok: {read_config(Path(sys.argv[1]))}")
        except ConfigError as e:
            print(f"gradsync: error: {e}", file=sys.stderr)
            sys.exit(2)
        sys.exit(0)
    worker(Path(sys.argv[1]))
    # Leave without interpreter teardown: in about one run in six, a C++ destructor there
    # (after the process group is destroyed, no Python frame left) aborts with "terminate
    # called without an active exception", and torchrun would restart a finished group.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
