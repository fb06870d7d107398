"""Elastic training across emulated machines (root): each machine a network namespace with its
own host name and ``--per-node`` workers under one torchrun agent, joined by shaped links; the
agents meet at a ``gradsync store`` on the switch, outside every machine, with the rendezvous
settings docs/multinode.md gives. Per launch the drill kills one worker process (its agent
restarts it), then a whole machine (the first: agent and workers), which returns
``--rejoin-after`` seconds later. Reports, medians over the launches: from each kill to the
group training again, and from the machine's return to a full group training.

Usage: python benchmarks/elastic_machines.py [--machines 2] [--per-node 2] [--link 1Gbit] [--launches 3]
           [--out docs/results/elastic_machines_results.json]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from gradsync.tools.links import SlowLinks
from gradsync.training import elastic
from gradsync.training.train import TrainConfig


def launch(args, cfg):
    workers = args.machines * args.per_node
    with SlowLinks(workers, args.link, per_node=args.per_node) as net:
        result = elastic.train(workers, cfg, min_workers=args.per_node, kill_every=args.kill_every, network=net,
                               victims=[("worker", args.machines - 1), ("machine", 0)],
                               rejoin_after=args.rejoin_after, timeout=600)
    return {"kills": result["kills"], "world_sizes": [e["world_size"] for e in result["events"]],
            "final_step": result["final"]["step"], "test_accuracy": result["history"][-1]["test_accuracy"],
            "elapsed_s": round(result["elapsed_s"], 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--link", default="1Gbit")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds of training between kills")
    parser.add_argument("--rejoin-after", type=float, default=15.0)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", default="docs/results/elastic_machines_results.json")
    args = parser.parse_args()
    cfg = TrainConfig(model="mlp", epochs=args.epochs, batch_size=32, timeout=10.0)
    runs = [launch(args, cfg) for _ in range(args.launches)]

    def median(kind, field):
        values = [k[field] for r in runs for k in r["kills"] if k["kind"] == kind and k.get(field) is not None]
        return round(statistics.median(values), 2) if values else None

    summary = {"worker_killed_to_training_s": median("worker", "recovered_s"),
               "machine_lost_to_training_s": median("machine", "recovered_s"),
               "machine_returned_to_admitted_s": median("machine", "admitted_s"),
               "load_average": round(os.getloadavg()[0], 1)}
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps({"machines": args.machines, "per_node": args.per_node, "link": args.link,
                                          "rendezvous": elastic.FAST_RENDEZVOUS, "rejoin_after_s": args.rejoin_after,
                                          "date": time.strftime("%Y-%m-%d"), "summary": summary, "runs": runs},
                                         indent=1))
