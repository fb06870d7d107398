"""Elastic training under a fault drill: the same run fault-free and with one worker
(torchrun agent and its process) SIGKILLed every ``--kill-every`` seconds and replaced; compare
final accuracy, steps, restarts and wall time, and check every recovery's replica agreement.

Usage: python benchmarks/elastic_training.py [--workers 4] [--kill-every 30] [--rejoin-after 10] [--epochs 60]
           [--out docs/results/elastic_results.json]
"""

import argparse
import json
from pathlib import Path

from gradsync.training.elastic import train
from gradsync.training.train import TrainConfig


def summary(result):
    last = result["history"][-1]
    return {"final_step": result["final"]["step"], "test_accuracy": last["test_accuracy"],
            "train_loss": last["train_loss"], "wall_s": round(result["elapsed_s"], 1),
            "kills": len(result["kills"]), "restarts": result["restarts"],
            "world_sizes": sorted({e["world_size"] for e in result["events"]}),
            "sha256": result["final"]["sha256"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--min-workers", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=30.0)
    parser.add_argument("--rejoin-after", type=float, default=10.0,
                        help="seconds before the replacement starts (the survivors train alone meanwhile)")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--out", default="docs/results/elastic_results.json")
    args = parser.parse_args()
    # batch 16 makes 89 steps an epoch: the CNN then trains for about 1.5 minutes on 2 cores
    cfg = TrainConfig(model="cnn", epochs=args.epochs, batch_size=16, lr=0.01, timeout=10.0)
    runs = {"fault-free": train(args.workers, cfg, min_workers=args.min_workers),
            "drill": train(args.workers, cfg, min_workers=args.min_workers, kill_every=args.kill_every,
                           rejoin_after=args.rejoin_after, seed=1)}
    table = {name: summary(r) for name, r in runs.items()}
    table["accuracy_difference_points"] = round(100 * abs(table["drill"]["test_accuracy"]
                                                         - table["fault-free"]["test_accuracy"]), 2)
    print(json.dumps(table, indent=1))
    Path(args.out).write_text(json.dumps({"workers": args.workers, "min_workers": args.min_workers,
                                          "kill_every_s": args.kill_every,
                                          "rejoin_after_s": args.rejoin_after, "summary": table, "runs": runs},
                                         indent=1))
