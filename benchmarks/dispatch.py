"""What one ``torch.distributed.all_reduce`` costs before any byte moves: world 1, 4 KiB.

Usage: python benchmarks/dispatch.py [--calls 3000] [--repetitions 7] [--out docs/results/dispatch.json]

One process (world 1, so nothing is sent and a sum is the tensor itself) and three groups
side by side: Gloo; a Python ``ProcessGroup`` that does nothing (its work is complete at
once), which is what torch's own dispatch into a Python backend costs; and the gradsync
backend (``new_group(backend="gradsync")``). Each repetition times ``--calls`` back-to-back
``dist.all_reduce`` of a 4 KiB float32 tensor on each group in turn (the first group rotating);
printed is the median over ``--repetitions`` of the microseconds per call. The tensor is
checked unchanged at the end (the sum over one rank is itself). Bad options: one line, exit 2.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.futures import Future

ELEMENTS = 1024                     # 4 KiB of float32
LABELS = {"gloo": "Gloo", "nothing": "Python group doing nothing", "gradsync": "gradsync backend"}


class DoneWork(dist.Work):
    """A collective that is already complete."""

    def __init__(self, result):
        super().__init__()
        self.future = Future()
        self.future.set_result(result)

    def wait(self, timeout=None):
        return True

    def get_future(self):
        return self.future


class NothingGroup(dist.ProcessGroup):
    """A Python process group whose all_reduce does nothing (right at world 1): torch's
    dispatch into a Python backend, and nothing else."""

    def allreduce(self, tensors, opts=None):
        return DoneWork(tensors)

    def getBackendName(self):
        return "nothing"


def per_call_us(group, tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor, group=group)
    return (time.perf_counter() - start) / calls * 1e6


def measure(groups: dict, calls: int, repetitions: int) -> dict:
    """Per group, the microseconds per call of each repetition (the groups take turns)."""
    tensor = torch.arange(ELEMENTS, dtype=torch.float32)
    for group in groups.values():
        per_call_us(group, tensor, 200)                    # warm-up: first-call set-up is not dispatch
    times = {name: [] for name in groups}
    names = list(groups)
    for rep in range(repetitions):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            times[name].append(per_call_us(groups[name], tensor, calls))
    if not torch.equal(tensor, torch.arange(ELEMENTS, dtype=torch.float32)):
        sys.exit("dispatch: WRONG RESULT: an all-reduce over one rank changed the tensor")
    return times


def groups() -> dict:
    """World 1 on Gloo, and the two other groups over the same world."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.Backend.register_backend("nothing", lambda opts, _=None: NothingGroup(opts.group_rank, opts.group_size),
                                  extended_api=True, devices=["cpu"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    import gradsync  # noqa: F401  (registers the "gradsync" backend)
    return {"gloo": None, "nothing": dist.new_group(backend="nothing"), "gradsync": dist.new_group(backend="gradsync")}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"dispatch.py: error: {message}\n")
        sys.exit(2)


def parse(argv=None):
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000, help="back-to-back calls per repetition and group")
    ap.add_argument("--repetitions", type=int, default=7, help="repetitions (figures: their median)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    for name in ("calls", "repetitions"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: expected at least 1")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out {args.out}: its folder does not exist")
    return args


def main(argv=None):
    args = parse(argv)
    started, load = time.strftime("%Y-%m-%d %H:%M:%S"), os.getloadavg()
    times = measure(groups(), args.calls, args.repetitions)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, us in medians.items():
        print(f"{LABELS[name]:28s} {us:8.1f} us per dist.all_reduce (4 KiB, world 1)")
    dist.destroy_process_group()
    if args.out:
        result = {"command": " ".join(["python", "benchmarks/dispatch.py"] + sys.argv[1:]),
                  "started": started, "load_average_at_start": load,
                  "torch": torch.__version__, "calls": args.calls, "repetitions": args.repetitions,
                  "median_us": medians, "per_repetition_us": times}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
