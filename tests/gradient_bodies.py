"""Worker bodies for test_gradients: unchanged DDP and FSDP2 on the gradsync backend with
approximate gradient sync, against the same training on Gloo."""

import torch
import torch.distributed as dist

from backend_bodies import gradsync_world


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 48))


def ddp_gradients(rank, workers, setting):
    """One DDP backward on the gradsync world with ``setting`` and on a Gloo group, same data:
    each gradient on both, every rank's own local gradients (for the bound), the user's loss
    all-reduced outside backward on both, and what the log said."""
    import logging

    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradsync.distributed import configure

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("gradsync").addHandler(handler)
    gradsync_world(rank, workers)
    configure(gradients=setting)
    gloo = dist.new_group(backend="gloo")
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    out = {"said": said}
    for name, group in (("gradsync", dist.group.WORLD), ("gloo", gloo)):
        model = DDP(_net(), process_group=group, bucket_cap_mb=0.01)   # several buckets
        for step in range(3):                                          # PowerSGD's warm start, error feedback
            model.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
        out[name] = [p.grad.detach().double().numpy().copy() for p in model.parameters()]
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)                            # a metric: never approximated
        out[f"{name}_loss"] = total.item()
    local = _net()
    local(x).square().mean().backward()
    mine = [p.grad.detach().double() for p in local.parameters()]
    every = [[torch.empty_like(g) for _ in range(workers)] for g in mine]
    for g, into in zip(mine, every):
        dist.all_gather(into, g.contiguous(), group=gloo)
    out["local"] = [torch.stack(each).numpy() for each in every]    # numpy: sent back by value
    return out


def fsdp_gradients(rank, workers, setting):
    """FSDP2 over the gradsync world with ``setting``: one backward's sharded gradients beside
    the same on Gloo."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from gradsync.distributed import configure

    gradsync_world(rank, workers)
    configure(gradients=setting)
    gloo = dist.new_group(backend="gloo")
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    out = {}
    for name, group in (("gradsync", dist.group.WORLD), ("gloo", gloo)):
        model = _net()
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model(x).square().mean().backward()
        out[name] = [p.grad.full_tensor().detach().double().numpy() for p in model.parameters()]
    return out


def make_world(rank, workers):
    """Only make the gradsync world (GRADSYNC_GRADIENTS from the environment)."""
    gradsync_world(rank, workers)
    return "made"
