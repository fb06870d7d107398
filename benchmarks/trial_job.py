"""The training job of the backend trials: DDP, FSDP2 or HSDP (a 2 x 2 mesh) on a small float64
MLP, one rank of it; ``benchmarks/backend_trials.py`` runs it under torchrun, four ranks.

By hand (what a trial runs; ``--elastic`` adds ``--max-restarts 1`` and ``--checkpoint-every 2``)::

    torchrun --nproc-per-node 4 --monitor-interval 13 benchmarks/trial_job.py \\
        --kind ddp --backend gradsync --timeout 10 --steps 12 --dir /tmp/trial

Each rank writes into ``--dir``: ``a<attempt>-rank<R>.json`` (its outcome: "ok" with its final parameters in
``a<attempt>-rank<R>.pt``, or "error" with the exception's type, first line, ``peer`` and the moment
it was caught, wall clock), ``a<attempt>-rank<R>.err`` (its fd 2: what it printed, with faulthandler's
stacks on SIGSEGV/SIGABRT/SIGUSR2). The fault plan comes in ``GRADSYNC_TRIAL_FAULT`` (JSON:
``rank``, ``signal`` "kill" or "stop", ``phase``, ``step``, ``delay`` s); the victim notes the
instant and what it was doing in ``fault.json``, then signals itself, so the survivors' times
count from the fault's own clock. Phases: ``start-up`` (armed before torch is imported: lands
in the import or ``init_process_group``), ``init`` (armed on entering it), ``first-collective``
(DDP's constructor broadcasts; FSDP2's first forward all-gathers), ``training`` (armed at a
step), ``checkpoint`` (inside ``torch.distributed.checkpoint.save``), ``shutdown`` (armed after
the final parameters are written: lands in ``destroy_process_group`` or the interpreter's exit).
"""

import faulthandler
import json
import os
import signal
import sys
import threading
import time

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
ME = f"a{ATTEMPT}-rank{RANK}"                    # this rank's files in --dir
DOING = {"phase": "start-up", "step": None}       # what this rank is doing now (the victim's note reads it)
TIMELINE = [("start-up", None, time.time())]      # (phase, step, wall clock) as this rank entered each
FEATURES, HIDDEN, OUTPUTS, BATCH = 16, 64, 4, 8


def plan() -> dict | None:
    """This rank's fault, if it is the victim (and this is the first attempt of an elastic job)."""
    fault = json.loads(os.environ.get("GRADSYNC_TRIAL_FAULT", "null"))
    return fault if fault and fault["rank"] == RANK and ATTEMPT == 0 else None


def strike(fault: dict, folder: str) -> None:
    """Note the instant and what this rank is doing, then SIGKILL or SIGSTOP this process."""
    note = {**fault, "t": time.time(), "doing": DOING["phase"], "at_step": DOING["step"], "pid": os.getpid()}
    with open(os.path.join(folder, "fault.json.tmp"), "w") as f:
        json.dump(note, f)
    os.replace(os.path.join(folder, "fault.json.tmp"), os.path.join(folder, "fault.json"))
    os.kill(os.getpid(), signal.SIGKILL if fault["signal"] == "kill" else signal.SIGSTOP)


def arm(phase: str, folder: str, step: int | None = None) -> None:
    """Enter ``phase``; if the plan strikes here, strike now (delay 0) or after its delay (a timer)."""
    DOING["phase"], DOING["step"] = phase, step
    TIMELINE.append((phase, step, time.time()))
    fault = plan()
    if not fault or fault["phase"] != phase or (phase == "training" and fault["step"] != step):
        return
    if fault["delay"] <= 0:
        strike(fault, folder)
    else:
        threading.Timer(fault["delay"], strike, args=(fault, folder)).start()


def options(argv):
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=["ddp", "fsdp", "hsdp"], required=True)
    p.add_argument("--backend", default="gradsync")
    p.add_argument("--timeout", type=float, default=10.0, help="the group's timeout (init_process_group)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save every N steps and resume from the last save (elastic); 0: one save, half-way")
    p.add_argument("--dir", required=True)
    return p.parse_args(argv)


def redirect_stderr(folder: str):
    """This rank's fd 2 (Python's and C++'s writes) into rank<R>.err; faulthandler on it."""
    err = open(os.path.join(folder, f"{ME}.err"), "a", buffering=1)
    os.dup2(err.fileno(), 2)
    faulthandler.enable(file=err, all_threads=True)
    faulthandler.register(signal.SIGUSR2, file=err, all_threads=True)     # the harness asks before killing a hang
    return err


def write_json(folder: str, name: str, record: dict) -> None:
    tmp = os.path.join(folder, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(folder, name))


def peer_of(exc: BaseException):
    """The ``peer`` an exception or any exception in its chain carries (gradsync's RankFailure)."""
    seen = 0
    while exc is not None and seen < 10:
        if getattr(exc, "peer", None) is not None:
            return exc.peer
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def where(exc: BaseException) -> list[str]:
    """The innermost frames of the exception's traceback (file:line function), last 4."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return [f"{f.filename.split('site-packages/')[-1].split('src/')[-1]}:{f.lineno} {f.name}" for f in frames]


def main(argv=None) -> None:
    args = options(argv)
    redirect_stderr(args.dir)
    arm("start-up", args.dir)
    try:
        outcome = train(args)
    except BaseException as exc:         # what a survivor saw: recorded when caught, then raised on
        text = str(exc).strip()
        write_json(args.dir, f"{ME}.json", {
            "rank": RANK, "attempt": ATTEMPT, "outcome": "error", "t": time.time(), "type": type(exc).__name__,
            "first_line": text.splitlines()[0][:400] if text else "", "text": text[:3000], "peer": peer_of(exc),
            "doing": DOING["phase"], "step": DOING["step"], "pid": os.getpid(), "timeline": TIMELINE,
            "where": where(exc)})
        raise
    write_json(args.dir, f"{ME}.json", {"rank": RANK, "attempt": ATTEMPT, "outcome": "ok", "t": time.time(),
                                              "pid": os.getpid(), "timeline": TIMELINE, **outcome})
    arm("shutdown", args.dir)
    import torch.distributed as dist

    dist.destroy_process_group()
    DOING["phase"] = "exit"


def batch(seed: int, step: int, rank: int):
    """Rank ``rank``'s batch at ``step``: the same on every backend, attempt and reference."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randn(BATCH, OUTPUTS, generator=g, dtype=torch.float64))


def model(seed: int):
    """The MLP every run starts from (seeded, float64: sums agree to rounding across backends)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUTPUTS)).double()


def reference(seed: int, steps: int, workers: int = 4) -> dict:
    """The parameters after ``steps`` steps in one process on every rank's batch: the mean of
    the ranks' losses, as DDP, FSDP2 and HSDP average the ranks' gradients."""
    import torch

    net = model(seed)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(net(x), y) for x, y in
                   (batch(seed, step, r) for r in range(workers))) / workers
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def train(args) -> dict:
    """Train ``args.steps`` steps (from the last checkpoint, when resuming); write this rank's
    final full parameters to rank<R>.pt; return what the record adds."""
    import datetime

    import torch
    import torch.distributed as dist

    if "gradsync" in args.backend:
        import gradsync  # noqa: F401   (registers the backend)
    arm("init", args.dir)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    net = wrap(args.kind, model(args.seed), args.dir)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = resume(net, opt, args.dir) if args.checkpoint_every else 0
    for step in range(start, args.steps):
        arm("training", args.dir, step)
        if step == start and args.kind != "ddp":
            arm("first-collective", args.dir, step)        # FSDP2's first forward all-gathers
        x, y = batch(args.seed, step, RANK)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if saves_after(step, args):
            arm("checkpoint", args.dir, step)
            save(net, opt, args.dir, step + 1)
    arm("final-gather", args.dir)
    torch.save(full_parameters(net), os.path.join(args.dir, f"{ME}.pt"))
    return {"start": start, "steps": args.steps}


def saves_after(step: int, args) -> bool:
    """Whether a checkpoint is saved after ``step``: every ``--checkpoint-every`` steps, else once, half-way."""
    if args.checkpoint_every:
        return (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps
    return step + 1 == max(1, args.steps // 2)


def wrap(kind: str, net, folder: str):
    """``net`` under DDP (small buckets: several all-reduces a step), FSDP2 on the world, or
    HSDP on a 2 x 2 mesh (replicate across its first dimension, shard across its second)."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if kind == "ddp":
        arm("first-collective", folder)                    # the constructor broadcasts the parameters
        return DistributedDataParallel(net, bucket_cap_mb=0.02)
    shape = (dist.get_world_size(),) if kind == "fsdp" else (2, dist.get_world_size() // 2)
    names = ("shard",) if kind == "fsdp" else ("replicate", "shard")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def full_parameters(net) -> dict:
    """Every parameter whole, by the plain model's names (FSDP2's shards gathered: a collective)."""
    module = getattr(net, "module", net)
    out = {}
    for name, value in module.state_dict().items():
        whole = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = whole.detach().clone()
    return out


def save(net, opt, folder: str, step: int) -> None:
    """A torch.distributed.checkpoint of model and optimizer after ``step`` steps (every rank
    writes its part); rank 0 then points latest.json at it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(net, opt)
    path = os.path.join(folder, f"checkpoint-{step}")
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if RANK == 0:
        write_json(folder, "latest.json", {"step": step, "path": path})


def resume(net, opt, folder: str) -> int:
    """Load the checkpoint latest.json points at, if any; the step to start from."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    try:
        with open(os.path.join(folder, "latest.json")) as f:
            latest = json.load(f)
    except FileNotFoundError:
        return 0
    model_state, optim_state = get_state_dict(net, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=latest["path"])
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return latest["step"]


if __name__ == "__main__":
    main(sys.argv[1:])
