"""Codec throughput of each compression method against a memory copy of the same gradient.

Usage: python benchmarks/compression_codecs.py [--elements 4194304] [--workers 4] [--repeats 7]
One worker's compute per step, on one thread as training workers run: compress, and decompress
what ``workers`` workers would send (the exchange itself moves nothing here), medians of
``repeats`` after a warm-up, as elements of float32 gradient per second and as a fraction of
a float32 copy (``torch.Tensor.copy_``) timed just before it. Writes
docs/results/compression_codecs.json.
"""

import argparse
import json
from pathlib import Path

import torch

from gradsync.tools.codec_predict import codec_rate, copy_rate

DOCS = Path(__file__).resolve().parent.parent / "docs"
METHODS = ("fp16", "bf16", "powersgd:rank=1", "powersgd:rank=4", "topk:ratio=0.01", "sign")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4 << 20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for m in METHODS:        # a copy timed just before each codec: the machine's load changes by the minute
        copy = copy_rate(args.elements, args.repeats)
        rate = codec_rate(m, args.workers, args.elements, args.repeats)
        rows.append({"method": m, "elements_per_s": rate, "of_copy": rate / copy, "copy_elements_per_s": copy})
    print(f"{args.elements} float32 elements, N = {args.workers}, one thread, torch {torch.__version__}")
    print(f"{'method':<18} {'GB/s of gradient':>16} {'copy GB/s':>9} {'of copy':>8}")
    for r in rows:
        print(f"{r['method']:<18} {r['elements_per_s'] * 4 / 1e9:>16.3f} {r['copy_elements_per_s'] * 4 / 1e9:>9.2f} "
              f"{r['of_copy']:>8.4f}")
    (DOCS / "results" / "compression_codecs.json").write_text(json.dumps({"elements": args.elements, "workers": args.workers,
                                                              "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
