"""Worker bodies for the compression tests over Gloo (run by gradsync.tools.launch.run)."""

import numpy as np
import torch

import gradsync


def inputs(rank, elements=1001):
    return torch.randn(elements, generator=torch.Generator().manual_seed(100 + rank))


def all_reduce_codecs(rank, workers):
    """Each codec's all_reduce result on this rank (the test recomputes references)."""
    out = {}
    for spec in ("fp16", "bf16", "topk:ratio=1", "sign", "powersgd:rank=2"):
        x = inputs(rank)
        gradsync.all_reduce(x, algorithm="ring", compression=spec)
        out[spec] = x.double().numpy()
    kept = gradsync.compression.make("topk:ratio=0.05")
    for step in range(3):                 # one codec kept across calls: error feedback carries over
        x = inputs(rank)
        gradsync.all_reduce(x, algorithm="tree", op="avg", compression=kept)
        out[f"topk-kept-{step}"] = x.double().numpy()
    return out


def ddp_hook_codecs(rank, workers):
    """Relative difference of the gradients after one DDP step, per codec, from DDP's own."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsync.torch import comm_hook

    grads = {}
    for name in ("default", "fp16", "topk:ratio=1", "powersgd:rank=1"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
        model = DistributedDataParallel(net)
        if name != "default":
            model.register_comm_hook(None, comm_hook("ring", compression=name))
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(16, 20, generator=g), torch.randn(16, 5, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {k: ((v - grads["default"]).norm() / grads["default"].norm()).item() for k, v in grads.items()}


__all__ = ["all_reduce_codecs", "ddp_hook_codecs", "np"]
