"""Weak scaling: time per training step against the number of workers, per strategy.

Usage: python experiments/weak_scaling.py [--workers 1,2,4,8] [--model cnn]
Each worker keeps 32 samples per step (global batch 32 N), trains one epoch of digits after a
warm-up epoch, and the step time is split into compute and synchronization. Appends a table
to docs/experiments.md and draws docs/figures/weak_scaling.png. On this 2-core machine N > 2
oversubscribes the cores, so compute time grows with N too: read the sync column.
"""

import argparse
from pathlib import Path

from gradsync.training.train import TrainConfig, train

DOCS = Path(__file__).resolve().parent.parent / "docs"
STRATEGIES = ("central", "host", "sharded", "ring", "tree", "halving_doubling")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--model", default="cnn")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    results = {}
    for strategy in STRATEGIES:
        for n in counts:
            h = train(n, TrainConfig(algorithm=strategy, epochs=2, batch_size=32 * n, model=args.model))["history"][-1]
            steps = 1438 // (32 * n)
            results[strategy, n] = {"step_s": h["time_s"] / steps, "compute_s": h["compute_s"] / steps,
                                    "sync_s": h["sync_s"] / steps, "bytes": h["bytes_per_worker"] / steps}
            print(strategy, n, results[strategy, n], flush=True)
    lines = ["", f"## Weak scaling: time per training step ({args.model}, 32 samples per worker per step)", "",
             "`python experiments/weak_scaling.py`. Unshaped local links; 2 cores, so N > 2 oversubscribes "
             "them and compute grows with N as well.", "",
             "| strategy | " + " | ".join(f"N = {n}: step (sync)" for n in counts) + " |",
             "|---|" + "---|" * len(counts)]
    for s in STRATEGIES:
        lines.append(f"| {s} | " + " | ".join(f"{1e3 * results[s, n]['step_s']:.1f} ms ({1e3 * results[s, n]['sync_s']:.1f} ms)"
                                               for n in counts) + " |")
    lines += ["", "![weak scaling](figures/weak_scaling.png)", ""]
    with open(DOCS / "experiments.md", "a") as fh:
        fh.write("\n".join(lines))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (step, sync) = plt.subplots(1, 2, figsize=(11, 4))
    for s in STRATEGIES:
        step.plot(counts, [1e3 * results[s, n]["step_s"] for n in counts], marker="o", label=s)
        sync.plot(counts, [1e3 * results[s, n]["sync_s"] for n in counts], marker="o", label=s)
    for ax, title in ((step, "time per step (ms)"), (sync, "synchronization per step (ms)")):
        ax.set_xlabel("workers")
        ax.set_ylabel(title)
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "figures" / "weak_scaling.png", dpi=110)


if __name__ == "__main__":
    main()
