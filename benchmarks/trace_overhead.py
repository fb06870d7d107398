"""What tracing costs: a ring all-reduce with ``trace=`` against the same call without, at 4 KB and
16 MB, in the same processes.

Usage: python benchmarks/trace_overhead.py [--workers 2] [--launches 3] [--out docs/results/trace_overhead.json]

Traced and untraced calls take turns in blocks of back-to-back calls (``bench.time_in_blocks``,
as ``gradsync bench`` times), so the machine's slow and fast moments fall on both alike; each
launch is a fresh process group, and the figure is the median over launches of each launch's
median per call. The ratio on/off is the overhead; the untraced call timed twice ("off_again")
says how far two identical variants drift apart here (the noise floor). Beside it, free of the network's noise, the
cost of recording one event (``Recorder.event``, in this process) and the events per collective.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

SIZES = {4096: 300, 16 << 20: 20}      # bytes -> timed calls per variant


def worker(rank, workers):
    import gradsync
    from gradsync.tools.bench import time_in_blocks
    from gradsync.runtime.tracing import Trace

    torch.set_num_threads(1)
    out = {}
    for nbytes, calls in SIZES.items():
        x = torch.randn(nbytes // 4)
        t = Trace()
        times = time_in_blocks({"off": lambda: gradsync.all_reduce(x, algorithm="ring"),
                                "on": lambda: gradsync.all_reduce(x, algorithm="ring", trace=t),
                                "off_again": lambda: gradsync.all_reduce(x, algorithm="ring")},
                               calls, dist.barrier)
        medians = torch.tensor([statistics.median(times[k]) for k in ("off", "on", "off_again")], dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)          # the slowest rank's, as bench reports
        doc = t.to_dict()
        collectives = sum(e.get("cat") == "collective" for e in doc["traceEvents"])
        out[nbytes] = {"off_s": medians[0].item(), "on_s": medians[1].item(), "off_again_s": medians[2].item(),
                       "events_per_collective": sum(e.get("cat") == "transfer" for e in doc["traceEvents"]) / collectives}
    return out


def event_cost_s(events: int = 200_000) -> float:
    """Seconds per recorded event (a timestamp, a small dict, an append)."""
    import time

    from gradsync.runtime.tracing import Trace, now_ns

    recorder = Trace(limit=events).begin(0, {"algorithm": "ring"})
    start = time.perf_counter()
    for k in range(events):
        t0 = now_ns()
        recorder.event("recv wait", t0, {"round": k, "peer": 1, "bytes": 1024})
    return (time.perf_counter() - start) / events


def main():
    from gradsync.tools.launch import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    launches = [run(worker, args.workers)[0] for _ in range(args.launches)]
    per_event = event_cost_s()
    result = {"workers": args.workers, "launches": args.launches, "event_cost_s": per_event, "sizes": {}}
    print(f"one event: {per_event * 1e9:.0f} ns")
    for nbytes in SIZES:
        off = statistics.median(launch[nbytes]["off_s"] for launch in launches)
        on = statistics.median(launch[nbytes]["on_s"] for launch in launches)
        ratios = [launch[nbytes]["on_s"] / launch[nbytes]["off_s"] for launch in launches]
        again = [launch[nbytes]["off_again_s"] / launch[nbytes]["off_s"] for launch in launches]
        events = launches[0][nbytes]["events_per_collective"]
        result["sizes"][nbytes] = {"off_s": off, "on_s": on, "overhead": on / off - 1,
                                   "per_launch_overhead": [r - 1 for r in ratios],
                                   "untraced_twice": statistics.median(again) - 1,
                                   "per_launch_untraced_twice": [r - 1 for r in again], "events_per_collective": events,
                                   "recording_share": events * per_event / off}
        print(f"{nbytes:>9} B: untraced {off * 1e6:9.1f} us, traced {on * 1e6:9.1f} us, "
              f"overhead {on / off - 1:+.1%} (per launch: {', '.join(f'{r - 1:+.1%}' for r in ratios)}); "
              f"untraced against untraced {statistics.median(again) - 1:+.1%}; "
              f"{events:.0f} events per collective: {events * per_event / off:.2%} of the untraced time")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
