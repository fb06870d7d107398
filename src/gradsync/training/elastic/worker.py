"""One rank of an elastic run, started (and restarted) by torchrun's agent: resume from the
last committed step, agree with every other rank on it, train, commit after every step.

>>> model = models.build("mlp", 0)
>>> len(_state_digest(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)))
32
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from ...errors import GradsyncError
from ...tools.launch import rendezvous_store
from .. import data, models
from ..train import SyncMeter
from .job import CHECKPOINT, over_gloo, read_config


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


def _join(workdir: Path, cfg) -> tuple[int, int]:
    """Record this process for the fault drill and join this round's process group: (rank, world)."""
    (workdir / "pids").mkdir(exist_ok=True)
    # for the fault drill: which worker processes each agent (its parent) runs
    (workdir / "pids" / f"{os.getppid()}.{os.environ.get('LOCAL_RANK', '0')}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = rendezvous_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, cfg.timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout))
    return rank, world


def _resume(workdir: Path, model, optimizer) -> tuple[int, list]:
    """Load the last committed step into ``model`` and ``optimizer``: (step, history); (0, []) if none."""
    if not (workdir / CHECKPOINT).exists():
        return 0, []
    state = torch.load(workdir / CHECKPOINT, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"], state["history"]


def worker(workdir: Path) -> None:
    """One rank of an elastic run, started (and restarted) by torchrun's agent.

    Example: ``torchrun ... -m gradsync.training.elastic DIR`` runs ``worker(Path(DIR))``.
    """
    from torch.nn.parallel import DistributedDataParallel

    cfg = over_gloo(read_config(workdir))          # "auto" is Gloo under the elastic agent
    rank, world = _join(workdir, cfg)
    split = data.digits(cfg.seed)
    model = models.build(cfg.model, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    step, history = _resume(workdir, model, optimizer)
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
