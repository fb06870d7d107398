"""What one lent GPU can check, in a few minutes: CUDA tensors through "cpu:gradsync,cuda:nccl"
at world 1, and whether CERAR's and PowerSGD's codecs on the GPU pay for themselves against the
links a GPU cluster has.

Usage: python benchmarks/gpu_check.py [--elements 67108864] [--out gpu_check.json]
       python benchmarks/gpu_check.py --device cpu --elements 1048576      (a smoke run without a GPU)

1. The backend: ``init_process_group("cpu:gradsync,cuda:nccl")`` on one rank (a TCP store on
   127.0.0.1); ``all_reduce`` of a CUDA tensor (NCCL's) and of a CPU tensor (gradsync's), and
   one DDP step of a CUDA model, each against the value it must have.
2. The codecs on the device, float32 gradients of --elements: CERAR (N = 8; c = 8, 12, 16:
   one worker's encode of every round and its decode, as ``coding.cerar.Worker`` runs them on
   tensors of any device) and PowerSGD (rank 4, the codec's whole compute with an exchange that
   moves nothing), each as GB/s of gradient, beside a host-to-device copy of the same bytes
   (pinned: PCIe) and the payload rates of 100, 200 and 400 Gbit/s NICs. A codec that processes
   the gradient faster than the NIC carries it costs less than it saves when its payload is
   smaller; one slower than the NIC cannot pay.

Writes every figure to --out (JSON), and to $OUT/gpu_check.json when $OUT is set (the device
tool's folder).
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

NICS_GBIT = (100, 200, 400)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _median_s(fn, device, repeats: int = 7) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def backend_at_world_one(device) -> dict:
    """The backend's CPU and CUDA paths at world 1, each checked against its value."""
    import torch.distributed as dist

    import gradsync.distributed

    gradsync.distributed.register()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "cpu:gradsync,cuda:nccl" if device.type == "cuda" else "gradsync"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    out = {"backend": backend}
    try:
        on_device = torch.arange(1000, dtype=torch.float32, device=device)
        dist.all_reduce(on_device)
        out["all_reduce_device_ok"] = bool(torch.equal(on_device.cpu(), torch.arange(1000, dtype=torch.float32)))
        on_cpu = torch.ones(1000)
        dist.all_reduce(on_cpu)
        out["all_reduce_cpu_ok"] = bool(torch.equal(on_cpu, torch.ones(1000)))
        torch.manual_seed(0)
        net = torch.nn.Linear(256, 256).to(device)
        reference = torch.nn.Linear(256, 256).to(device)
        reference.load_state_dict(net.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        x = torch.randn(32, 256, device=device)
        ddp(x).square().mean().backward()
        reference(x).square().mean().backward()
        out["ddp_grad_max_diff"] = max((a.grad - b.grad).abs().max().item()
                                       for a, b in zip(net.parameters(), reference.parameters()))
    finally:
        dist.destroy_process_group()
    return out


def codec_rates(device, elements: int) -> dict:
    """GB/s of float32 gradient each codec processes on ``device``, beside PCIe and NICs."""
    from gradsync.coding import cerar
    from gradsync.compression import make
    from gradsync.tools.codec_predict import StillExchange

    grad = torch.randn(elements, device=device)
    nbytes = grad.numel() * grad.element_size()
    host = torch.randn(elements).pin_memory() if device.type == "cuda" else torch.randn(elements)
    target = torch.empty_like(grad)
    out = {"elements": elements, "device": str(device),
           "host_to_device_GBps": nbytes / _median_s(lambda: target.copy_(host, non_blocking=True), device) / 1e9,
           "nic_payload_GBps": {f"{g} Gbit/s": g / 8 for g in NICS_GBIT}, "codecs": {}}
    for c in (8, 12, 16):
        design = cerar.make(8, c, "optimized", dtype="float32")

        def coded(design=design):
            worker = cerar.Worker(design, 1, grad)
            for t in range(1, design.rounds + 1):        # what arrives stands in for a peer's packet
                worker.receive(t).copy_(worker.packet(t))
                worker.received(t)
            return worker.result()

        out["codecs"][f"cerar N=8 c={c}"] = nbytes / _median_s(coded, device) / 1e9
    codec, still = make("powersgd:rank=4"), StillExchange(8)
    work = grad.clone()
    try:
        out["codecs"]["powersgd:rank=4"] = nbytes / _median_s(lambda: codec.reduce(work.copy_(grad), still, key=0),
                                                              device) / 1e9
    except (RuntimeError, TypeError) as exc:                  # a codec that keeps host state
        out["codecs"]["powersgd:rank=4"] = f"failed on {device}: {str(exc).splitlines()[0]}"
    out["pays_against"] = {name: [nic for nic, rate in out["nic_payload_GBps"].items() if rate < value]
                           for name, value in out["codecs"].items() if isinstance(value, float)}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=64 << 20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
              "run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    result = {"torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
              "backend": backend_at_world_one(device), "rates": codec_rates(device, args.elements)}
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out).write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)
    ok = result["backend"]["all_reduce_device_ok"] and result["backend"]["all_reduce_cpu_ok"] \
        and result["backend"]["ddp_grad_max_diff"] <= 1e-6
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
