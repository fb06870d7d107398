"""Data-parallel training over local worker processes, synchronizing with any gradsync algorithm.

Every worker holds a replica of the model and takes its share of each global batch (the
same order everywhere); DistributedDataParallel calls gradsync's comm hook for each gradient
bucket. The hook measures what synchronization costs: its time, the bytes this worker sends
(counted from the schedule), and for approximate algorithms the relative error of the
gradient against the exact average, computed outside the timed part.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from .. import algorithms, dtypes
from ..errors import ConfigError, NonFiniteError
from ..runtime.compile import compiled, frozen, pick
from ..tools.progress_bar import bar as progress_bar
from ..tools.launch import as_launched, launched, run
from ..integrations.ddp import comm_hook
from . import data, models


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every field has the CLI flag of the same name."""

    algorithm: str = "ring"
    components: int | None = None     # CERAR c (default 2N)
    eps: float | None = None          # CERAR eps (default: the best for float32)
    epochs: int = 10
    batch_size: int = 64              # global batch, split across workers
    model: str = "mlp"
    bucket_mb: float = 25.0           # DDP bucket size: gradients fused before synchronizing
    lr: float = 0.05
    resync_every: int = 0             # broadcast rank 0's parameters every K steps (0: never)
    seed: int = 0
    timeout: float = 60.0
    transport: str = "auto"           # gloo, shm (shared memory) or auto, as gradsync.all_reduce takes
    compression: str | None = None    # a gradsync.compression codec, e.g. "powersgd:rank=4"

    def check(self, workers: int) -> "TrainConfig":
        if self.algorithm != "auto":
            algorithms.get(self.algorithm)
        if self.transport not in ("gloo", "shm", "auto"):
            raise ConfigError(f"transport must be one of gloo, shm, auto, got {self.transport!r}")
        if self.compression is not None:
            from ..compression import make
            make(self.compression)
        if self.model not in models.MODELS:
            raise ConfigError(f"unknown model {self.model!r}: expected one of {', '.join(models.MODELS)}")
        for name, value, low in (("epochs", self.epochs, 1), ("batch_size", self.batch_size, workers),
                                 ("resync_every", self.resync_every, 0)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0 < self.bucket_mb <= 1024 or not 0 < self.lr < 10:
            raise ConfigError(f"bucket_mb must be in (0, 1024] and lr in (0, 10), got {self.bucket_mb}, {self.lr}")
        return self

    def options(self) -> dict:
        takes = algorithms.get(self.algorithm).options if self.algorithm != "auto" else {}
        return {k: v for k, v in (("components", self.components), ("eps", self.eps)) if v is not None and k in takes}


class SyncMeter:
    """Wraps gradsync's public DDP hook (``gradsync.integrations.ddp.comm_hook``) and measures, since the
    last ``reset``, each bucket's synchronization: the time from starting its all-reduce to its
    completion (overlapping backward, so these add up to more than the step's wall time can
    show), the bytes this worker sends (counted from the schedule), and for approximate
    algorithms the error against the exact average."""

    def __init__(self, cfg: TrainConfig, rank: int, workers: int, trace=None):
        self.cfg, self.rank, self.workers = cfg, rank, workers
        self.approximate = not algorithms.get(cfg.algorithm).exact if cfg.algorithm != "auto" else False
        self.approximate = self.approximate or cfg.compression is not None
        self.sync = comm_hook(cfg.algorithm, timeout=cfg.timeout, trace=trace, transport=cfg.transport,
                              compression=cfg.compression, **cfg.options())
        self._sent: dict = {}         # bucket elements -> bytes this worker sends, one entry per bucket size
        self.reset()

    def reset(self):
        self.sync_s = self.resync_s = self.measure_s = 0.0
        self.bytes = self.resync_bytes = 0
        self.err_sq = self.exact_sq = 0.0

    def hook(self, state, bucket):
        tensor = bucket.buffer()
        exact = None
        if self.approximate:                      # the reference, timed apart and left out
            t0 = time.perf_counter()
            exact = tensor.clone()
            dist.all_reduce(exact)
            exact /= self.workers
            self.measure_s += time.perf_counter() - t0
        algorithm, options = self.cfg.algorithm, self.cfg.options()
        if algorithm == "auto":
            algorithm, options = pick(tensor, self.workers)
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.numel() not in self._sent:
            self._sent[tensor.numel()] = self._bytes_sent(algorithm, options, tensor.numel(), dtype, tensor.element_size())
        sent = self._sent[tensor.numel()]
        start = time.perf_counter()

        def done(future):
            result = future.value()
            self.sync_s += time.perf_counter() - start
            self.bytes += sent
            if exact is not None:
                self.err_sq += float((result - exact).pow(2).sum())
                self.exact_sq += float(exact.pow(2).sum())
            return result

        return self.sync(state, bucket).then(done)

    def _bytes_sent(self, algorithm, options, elements, dtype, itemsize) -> int:
        """Bytes this worker sends for a bucket, counted from the schedules (the codec's, if any)."""
        if self.cfg.compression is None:
            schedule = compiled(algorithm, self.workers, elements, dtype, frozen(options), self.rank).schedule
            return int(schedule.elements_sent()[self.rank]) * itemsize
        from ..tools.codec_predict import wire_schedules
        return sum(int(s.elements_sent()[self.rank]) * dtypes.itemsize(d)
                   for s, d in wire_schedules(self.cfg.compression, algorithm, self.workers, elements, options))


def _replica_spread(model) -> float:
    """Largest absolute difference between any parameter and rank 0's copy of it."""
    flat = parameters_to_vector(model.parameters()).detach()
    reference = flat.clone()
    dist.broadcast(reference, 0)
    spread = torch.tensor([float((flat - reference).abs().max())])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return spread.item()


def worker(rank: int, workers: int, cfg: TrainConfig, progress: bool = False, trace: bool = False):
    """One worker's training; rank 0 returns one row of metrics per epoch. With ``trace``, every
    rank returns ``{"history": rows or None, "trace": its Chrome trace of the buckets' all-reduces}``."""
    from torch.nn.parallel import DistributedDataParallel

    from ..runtime.tracing import Trace

    torch.set_num_threads(1)
    split = data.digits(cfg.seed)
    model = models.build(cfg.model, cfg.seed)
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb)
    tracer = Trace() if trace else None
    meter = SyncMeter(cfg, rank, workers, tracer)
    ddp.register_comm_hook(None, meter.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=0.9)
    history, step = [], 0
    bar = progress_bar(cfg.epochs, "training") if progress and rank == 0 else None
    for epoch in range(cfg.epochs):
        meter.reset()
        losses, start = [], time.perf_counter()
        for batch in data.batches(len(split.y_train), cfg.batch_size, epoch, cfg.seed):
            idx = data.shard(batch, rank, workers)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(split.x_train[idx]), split.y_train[idx])
            if not math.isfinite(loss.item()):                    # stop, rather than train on NaN
                raise NonFiniteError(f"the training loss is {loss.item()} at epoch {epoch + 1}, step {step + 1} on "
                                     f"rank {rank} ({cfg.algorithm}{_described(cfg.options())}): lower the "
                                     f"learning rate or, for an approximate algorithm, the components")
            loss.backward()                                       # the hook synchronizes here
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if cfg.resync_every and step % cfg.resync_every == 0:
                t0 = time.perf_counter()
                flat = parameters_to_vector(model.parameters()).detach()
                dist.broadcast(flat, 0)
                vector_to_parameters(flat, model.parameters())
                meter.resync_s += time.perf_counter() - t0
                meter.resync_bytes += flat.numel() * flat.element_size()
        elapsed = time.perf_counter() - start
        with torch.no_grad():
            accuracy = (model(split.x_test).argmax(1) == split.y_test).float().mean().item()
        loss_mean = torch.tensor([sum(losses) / len(losses)])
        dist.all_reduce(loss_mean)
        row = {"epoch": epoch + 1, "loss": loss_mean.item() / workers, "test_accuracy": accuracy,
               "time_s": elapsed, "sync_s": meter.sync_s, "resync_s": meter.resync_s,
               "compute_s": elapsed - meter.sync_s - meter.resync_s - meter.measure_s,
               "measurement_s": meter.measure_s,
               "bytes_per_worker": meter.bytes + meter.resync_bytes, "resync_bytes": meter.resync_bytes,
               "grad_rel_error": (meter.err_sq / meter.exact_sq) ** 0.5 if meter.exact_sq else 0.0,
               "replica_max_diff": _replica_spread(model)}
        history.append(row)
        if bar:
            bar(f"epoch {row['epoch']}: loss {row['loss']:.3f}, accuracy {row['test_accuracy']:.3f}")
    if bar:
        bar(None)
    if tracer is not None:
        return {"history": history if rank == 0 else None, "trace": tracer.to_dict()}
    return history if rank == 0 else None


def _described(options: dict) -> str:
    return "".join(f", {k} {v}" for k, v in options.items())


def train(workers: int, cfg: TrainConfig, progress: bool = False, network=None, trace: bool = False) -> dict:
    """Train on ``workers`` local processes; return the configuration and per-epoch history
    (with ``trace``, also the ranks' Chrome traces merged, under "trace"). Started by torchrun
    (or mpirun, srun), train as this rank of that job instead, on however many machines it
    spans: the history is rank 0's, None on the others, and ``workers`` is the job's size."""
    from ..tools.trace_files import merge

    if launched() is not None:        # one rank of a job torchrun (or mpirun, srun) started, maybe on many machines
        result, rank, workers = as_launched(worker, cfg, progress, False, timeout=cfg.timeout)
        cfg.check(workers)
        return {"workers": workers, "config": asdict(cfg), "history": result, "rank": rank}
    cfg.check(workers)
    results = run(worker, workers, cfg, progress, trace, timeout=cfg.timeout, job_timeout=cfg.timeout * 10 + 600,
                  network=network)
    if trace:
        return {"workers": workers, "config": asdict(cfg), "history": results[0]["history"],
                "trace": merge([r["trace"] for r in results])}
    return {"workers": workers, "config": asdict(cfg), "history": results[0]}


def plot(runs: dict, path: str) -> None:
    """Test accuracy and cumulative time per epoch, one line per run (e.g. CERAR and exact ring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, clock) = plt.subplots(1, 2, figsize=(11, 4))
    for label, result in runs.items():
        epochs = [r["epoch"] for r in result["history"]]
        acc.plot(epochs, [r["test_accuracy"] for r in result["history"]], marker="o", label=label)
        total, sync = 0.0, 0.0
        totals, syncs = [], []
        for r in result["history"]:
            total += r["time_s"] - r.get("measurement_s", 0.0)
            sync += r["sync_s"] + r["resync_s"]
            totals.append(total)
            syncs.append(sync)
        line, = clock.plot(epochs, totals, marker="o", label=f"{label}: total")
        clock.plot(epochs, syncs, linestyle="--", color=line.get_color(), label=f"{label}: synchronization")
    for ax in (acc, clock):
        ax.xaxis.get_major_locator().set_params(integer=True)
    acc.set_xlabel("epoch")
    acc.set_ylabel("test accuracy")
    acc.legend()
    clock.set_xlabel("epoch")
    clock.set_ylabel("cumulative seconds")
    clock.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
