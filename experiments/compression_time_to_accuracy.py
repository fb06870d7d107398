"""Time to accuracy: exact synchronization, CERAR and gradient compression on the digits CNN.

Every method trains the same CNN (scikit-learn's digits, 8x8, no download) from the same
initial weights on the same data order, with N local workers, global batch 64, SGD with
momentum; test accuracy is measured every EVAL_EVERY steps, outside the timed part, and the
clock counts only training steps (forward, backward with the synchronization, optimizer).
Per step the sync time is the time from a bucket's all-reduce start to its completion.

Methods: ring and native (Gloo's all_reduce, through DDP's default hook), CERAR (c = 1.5N, 2N),
CERAR c = 2N with fp16 packets (eps of least error measured in float16, max_error raised to
0.5: gradsync's default bound refuses it), and over the ring: fp16, bf16, powersgd (r = 1, 4),
topk (1%), sign.

Stragglers (--straggler): ``link:25Mbit`` shapes the last worker's link (both directions) to
that rate; ``sleep:50`` makes the last worker sleep 50 ms in every step before its forward
pass (a slow machine); ``random:20`` makes every worker sleep an exponentially distributed
time of mean 20 ms in every step (seeded by seed, rank and step: the same delays for every
method), so the slowest worker changes from step to step.

Usage (root for --link): python experiments/compression_time_to_accuracy.py [--link 100Mbit]
    [--workers 4] [--epochs 10] [--seeds 0,1,2] [--model cnn|wide] [--methods ring,fp16,...]
    [--straggler link:RATE|sleep:MS|random:MS] [--report]
Writes docs/results/compression_results.json (merged by link, workers and seed), the figures
docs/figures/compression_tta_<link>_n<N>.png, and the section of docs/experiments.md between
its markers.
"""

import argparse
import json
import statistics
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gradsync.compression import make
from gradsync.tools.codec_predict import collective_overhead, measure_overhead, predict
from gradsync.tools.launch import run
from gradsync.torch import comm_hook
from gradsync.training import data, models

DOCS = Path(__file__).resolve().parent.parent / "docs"
RESULTS = DOCS / "results" / "compression_results.json"
EVAL_EVERY = 10
TARGET = 0.95
LR = 0.05


def methods(workers):
    """name -> (algorithm, compression, options) for gradsync's hook, or None for DDP's own."""
    c15, c2 = int(1.5 * workers), 2 * workers
    return {"ring": ("ring", None, {}), "native": None,
            f"cerar c={c15}": ("cerar", None, {"components": c15}),
            f"cerar c={c2}": ("cerar", None, {"components": c2}),
            f"cerar+fp16 c={c2}": ("cerar", "fp16", {"components": c2, "max_error": 0.5}),
            "fp16": ("ring", "fp16", {}), "bf16": ("ring", "bf16", {}),
            "powersgd r=1": ("ring", "powersgd:rank=1", {}), "powersgd r=4": ("ring", "powersgd:rank=4", {}),
            "topk 1%": ("ring", "topk:ratio=0.01", {}), "sign": ("ring", "sign", {})}


@lru_cache(maxsize=8)
def fp16_eps(workers: int, components: int) -> float:
    """The unity design's eps of least error with float16 packets, measured on a grid (the
    default design is chosen on a prediction that overstates float16's rounding about 10x)."""
    from gradsync.coding import cerar

    grid = np.geomspace(1e-3, 0.3, 16)
    errors = [cerar.measure(cerar.unity(workers, components, float(e), "per_worker"), 1 << 12, "float16")["rel_error"]
              for e in grid]
    return float(grid[int(np.argmin(errors))])


def chosen_method(name: str, workers: int):
    """``methods(workers)[name]``, with the eps of CERAR over fp16 packets filled in."""
    chosen = methods(workers)[name]
    if chosen is not None and chosen[:2] == ("cerar", "fp16"):
        chosen = (*chosen[:2], {**chosen[2], "eps": fp16_eps(workers, chosen[2]["components"])})
    return chosen


def build(model: str, seed: int):
    """The digits CNN of gradsync train, or a wide MLP (64-512-512-10, 300k parameters, 8x the
    CNN's bytes) where the wire weighs more against the runtime's per-collective cost."""
    if model == "cnn":
        return models.build("cnn", seed)
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def parse_straggler(text):
    """``"sleep:50"`` -> ("sleep", 50.0); ``"link:25Mbit"`` -> ("link", "25Mbit"); None stays None."""
    if not text:
        return None
    kind, _, value = text.partition(":")
    if kind in ("sleep", "random"):
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if ms > 0:
            return kind, ms
    elif kind == "link" and value:
        return kind, value
    raise SystemExit(f"error: --straggler must be link:RATE, sleep:MS or random:MS with MS > 0, got {text!r}")


def delays(straggler, rank, workers, seed, steps):
    """Seconds each step of this rank sleeps before its forward pass (zeros without a compute straggler)."""
    if straggler is None or straggler[0] == "link":
        return np.zeros(steps)
    if straggler[0] == "sleep":
        return np.full(steps, straggler[1] / 1e3 if rank == workers - 1 else 0.0)
    return np.random.default_rng([seed, rank]).exponential(straggler[1] / 1e3, steps)


def worker(rank, workers, method, epochs, seed, model_name="cnn", straggler=None, chosen=None):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    split = data.digits(seed)
    model = build(model_name, seed)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    chosen = chosen_method(method, workers) if chosen is None else chosen   # the parent's: eps searched once
    inner = allreduce_hook if chosen is None else comm_hook(chosen[0], compression=chosen[1], **chosen[2])
    sync = [0.0]

    def timed(state, bucket):
        start = time.perf_counter()

        def done(future):
            sync[0] += time.perf_counter() - start
            return future.value()[0] if isinstance(future.value(), list) else future.value()

        return inner(dist.group.WORLD if chosen is None else None, bucket).then(done)

    ddp.register_comm_hook(None, timed)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    points, clock, step, syncs = [], 0.0, 0, []
    sleeps = delays(straggler, rank, workers, seed, epochs * (len(split.y_train) // 64 + 1))

    def evaluate():
        with torch.no_grad():
            acc = (model(split.x_test).argmax(1) == split.y_test).float().mean().item()
        points.append({"step": step, "time_s": clock, "accuracy": acc})
        dist.barrier()

    evaluate()
    for epoch in range(epochs):
        for batch in data.batches(len(split.y_train), 64, epoch, seed):
            idx = data.shard(batch, rank, workers)
            sync[0] = 0.0
            start = time.perf_counter()
            if sleeps[step]:
                time.sleep(sleeps[step])
            optimizer.zero_grad()
            F.cross_entropy(ddp(split.x_train[idx]), split.y_train[idx]).backward()
            optimizer.step()
            clock += time.perf_counter() - start
            syncs.append(sync[0])
            step += 1
            if step % EVAL_EVERY == 0:
                evaluate()
    if step % EVAL_EVERY:
        evaluate()
    overhead = measure_overhead()          # the runtime's fixed cost per collective, in these workers
    elements = sum(p.numel() for p in model.parameters())
    return {"points": points, "sync_s_median": statistics.median(syncs), "steps": step,
            "elements": elements, "overhead": overhead} if rank == 0 else None


def summary(result):
    reached = [p for p in result["points"] if p["accuracy"] >= TARGET]
    return {"time_to_target_s": reached[0]["time_s"] if reached else None,
            "steps_to_target": reached[0]["step"] if reached else None,
            "final_accuracy": result["points"][-1]["accuracy"], "total_s": result["points"][-1]["time_s"]}


def predicted_sync(method, workers, elements, link, model="cnn", straggler=None, overhead=None):
    """The simulator's sync time for one step's single bucket (ethernet preset at the link; a
    slow link's rate if there is one, since every round of these ring schedules crosses it),
    for a codec plus its compute and the runtime's fixed cost of its collectives (``overhead``
    as ``measure_overhead`` gives it); None under a compute straggler, whose sleep the sync
    absorbs."""
    if straggler is not None:
        if straggler[0] != "link":
            return None
        link = straggler[1]
    from gradsync import algorithms
    from gradsync.model.simulate import simulate
    from gradsync.model.topology import preset

    chosen = chosen_method(method, workers)
    topo = preset("ethernet", workers=workers, nic=link or "100Gbit", latency="50us")
    if chosen is None or chosen[1] is None:
        name, options = ("ring", {}) if chosen is None else (chosen[0], chosen[2])
        return simulate(algorithms.build(name, workers, elements, **options), topo, 4).time
    codec = make(chosen[1])        # told the CNN's tensors, as the DDP hook tells it (one bucket)
    codec.layout(0, [p.shape for p in reversed(list(build(model, 0).parameters()))])
    return predict(codec, chosen[0], topo, elements, workers, chosen[2], key=0, overhead=overhead)["time_s"]


def pooled_overhead(stored, n: str) -> dict:
    """The median of the fixed costs measured in the workers of every run with N = ``n``
    (``"n4"``), for the runs made before it was measured; measured now if none was."""
    found = [r["overhead"] for key, rows in stored.items() if key.split("/")[1] == n
             for r in rows.values() if r.get("overhead")]
    if not found:
        return collective_overhead(int(n[1:]))
    return {k: statistics.median(o[k] for o in found) for k in ("per_collective_s", "per_round_s")}


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (clock, steps) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, result in rows.items():
        pts = result["points"]
        line, = clock.plot([p["time_s"] for p in pts], [p["accuracy"] for p in pts], label=name, lw=1.4)
        steps.plot([p["step"] for p in pts], [p["accuracy"] for p in pts], lw=1.4, color=line.get_color())
    for ax, label in ((clock, "training wall-clock (s), evaluation excluded"), (steps, "step")):
        ax.axhline(TARGET, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
    clock.set_ylabel("test accuracy")
    clock.legend(fontsize=8, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MODELS = {"cnn": "digits CNN (38k parameters)", "wide": "wide MLP (300k parameters)"}
MARK_BEGIN, MARK_END = "<!-- compression: begin -->", "<!-- compression: end -->"


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(stored) -> str:
    """Markdown tables from the stored runs: per link and N, medians over the seeds that ran."""
    groups = {}
    for key, rows in stored.items():
        link, n, seed, *rest = key.split("/")
        groups.setdefault((rest[0] if rest else "cnn", link, n, rest[1] if len(rest) > 1 else ""), []).append(rows)
    lines = []
    for (model, link, n, straggler), runs in sorted(groups.items(), key=lambda g: (g[0][0], g[0][3], g[0][1],
                                                                                   int(g[0][2][1:]))):
        lines += [f"### {MODELS[model]}, {link}, N = {n[1:]}{', straggler ' + straggler if straggler else ''}: "
                  f"medians over {len(runs)} seed(s)", "",
                  "| method | time to 95% | steps to 95% | final accuracy | training time | sync per step "
                  "| predicted sync | predicted / measured |",
                  "|---|---|---|---|---|---|---|---|"]
        names = list(dict.fromkeys(name for r in runs for name in r))
        for name in names:
            rs = [r[name] for r in runs if name in r]
            t, st = _median([r["time_to_target_s"] for r in rs]), _median([r["steps_to_target"] for r in rs])
            sync, pred = _median([r["sync_s_median"] for r in rs]), _median([r["predicted_sync_s"] for r in rs])
            reached = sum(r["time_to_target_s"] is not None for r in rs)
            lines.append(f"| {name}{f' ({len(rs)} seeds)' if len(rs) != len(runs) else ''} | "
                         f"{f'{t:.2f} s' if t is not None else 'not reached'}"
                         f"{f' ({reached}/{len(rs)} reached)' if 0 < reached < len(rs) else ''} | "
                         f"{f'{st:g}' if st is not None else '-'} | "
                         f"{_median([r['final_accuracy'] for r in rs]):.3f} | {_median([r['total_s'] for r in rs]):.2f} s | "
                         f"{sync * 1e3:.2f} ms | " + (f"{pred * 1e3:.2f} ms | {pred / sync:.2f} |" if pred else "- | - |"))
        lines.append("")
    return "\n".join(lines + stragglers(stored))


def stragglers(stored) -> list[str]:
    """Per model, link and N with straggler runs: each method's time to 95% and sync per step
    (medians over the seeds each column ran) without a straggler, on the seeds of any
    straggler run, and with each straggler."""
    found = {}
    for key in stored:
        link, n, seed, *rest = key.split("/")
        if len(rest) > 1:
            found.setdefault((rest[0], link, n), {}).setdefault(rest[1], set()).add(seed)
    lines = []
    for (model, link, n), kinds in sorted(found.items()):
        seeds = {"none": sorted(set.union(*kinds.values()))} | {k: sorted(v) for k, v in sorted(kinds.items())}
        columns = {kind: [stored.get(f"{link}/{n}/{s}" + ("" if model == "cnn" else f"/{model}")
                                     + ("" if kind == "none" else f"/{kind}"), {}) for s in chosen]
                   for kind, chosen in seeds.items()}
        lines += [f"### Stragglers: {MODELS[model]}, {link}, N = {n[1:]}: time to 95% (sync per step)", "",
                  "| method | " + " | ".join(f"{k} (seed {', '.join(s[4:] for s in v)})" for k, v in seeds.items())
                  + " |", "|---" * (len(columns) + 1) + "|"]
        names = list(dict.fromkeys(name for runs in columns.values() for r in runs for name in r))
        for name in names:
            cells = []
            for runs in columns.values():
                rs = [r[name] for r in runs if name in r]
                if not rs:
                    cells.append("-")
                    continue
                t, sync = _median([r["time_to_target_s"] for r in rs]), _median([r["sync_s_median"] for r in rs])
                cells.append(f"{f'{t:.1f} s' if t is not None else 'not reached'} ({sync * 1e3:.0f} ms)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def write_report(stored):
    doc = DOCS / "experiments.md"
    text = doc.read_text() if doc.exists() else ""
    section = f"{MARK_BEGIN}\n{report(stored)}\n{MARK_END}"
    if MARK_BEGIN in text:
        text = text[:text.index(MARK_BEGIN)] + section + text[text.index(MARK_END) + len(MARK_END):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--link", default=None, help="emulated link rate, e.g. 100Mbit (root); default loopback")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", default=None)
    ap.add_argument("--model", choices=["cnn", "wide"], default="cnn")
    ap.add_argument("--straggler", default=None, help="link:RATE, sleep:MS or random:MS (see above)")
    ap.add_argument("--report", action="store_true", help="only rewrite the tables from the stored results")
    args = ap.parse_args()
    straggler = parse_straggler(args.straggler)
    if straggler and straggler[0] == "link" and not args.link:
        raise SystemExit("error: --straggler link:RATE needs --link (the others' rate)")
    if args.report:                  # predictions again, at the codec rates measured now
        stored = json.loads(RESULTS.read_text())
        for key, rows in stored.items():
            link, n, _, *rest = key.split("/")
            for name, r in rows.items():      # runs before the overhead was kept: the others' median
                overhead = r.get("overhead") or pooled_overhead(stored, n)
                r["predicted_sync_s"] = predicted_sync(name, int(n[1:]), r["elements"],
                                                       None if link == "loopback" else link, (rest or ["cnn"])[0],
                                                       parse_straggler(rest[1] if len(rest) > 1 else None), overhead)
        RESULTS.write_text(json.dumps(stored, indent=1))
        write_report(stored)
        return
    names = args.methods.split(",") if args.methods else list(methods(args.workers))
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    link = args.link or "loopback"
    for seed in map(int, args.seeds.split(",")):
        key = f"{link}/n{args.workers}/seed{seed}" + ("" if args.model == "cnn" and not straggler else
                                                      f"/{args.model}") + (f"/{args.straggler}" if straggler else "")
        rows = stored.setdefault(key, {})
        if args.link:
            from gradsync.tools.links import SlowLinks
            network = SlowLinks(args.workers, args.link)
        else:
            network = None
        try:
            if network is not None:
                network.__enter__()
                if straggler and straggler[0] == "link":
                    network.set_rate(args.workers - 1, straggler[1])
            for name in names:
                t0 = time.time()
                result = run(worker, args.workers, name, args.epochs, seed, args.model, straggler,
                             chosen_method(name, args.workers), network=network, timeout=1800)[0]
                result.update(summary(result))
                result["predicted_sync_s"] = predicted_sync(name, args.workers, result["elements"], args.link,
                                                            args.model, straggler, result["overhead"])
                rows[name] = result
                pred = result["predicted_sync_s"]
                print(f"{key} {name}: {result['time_to_target_s']} s to {TARGET}, final "
                      f"{result['final_accuracy']:.3f}, sync/step {result['sync_s_median'] * 1e3:.2f} ms "
                      f"(predicted {pred * 1e3 if pred else float('nan'):.2f} ms), ran {time.time() - t0:.0f} s",
                      flush=True)
                RESULTS.write_text(json.dumps(stored, indent=1))
        finally:
            if network is not None:
                network.__exit__(None, None, None)
        (DOCS / "figures").mkdir(exist_ok=True)
        tag = (args.straggler or "").replace(":", "_")
        plot(rows, DOCS / "figures" / f"compression_tta_{link}_n{args.workers}"
             f"{'' if args.model == 'cnn' else '_' + args.model}{'_' + tag if tag else ''}.png",
             f"{MODELS[args.model]}, {args.workers} workers, {link} links"
             f"{', straggler ' + args.straggler if straggler else ''}, seed {seed}")
    write_report(stored)
    print(f"results in {RESULTS}; tables in docs/experiments.md")


if __name__ == "__main__":
    main()
