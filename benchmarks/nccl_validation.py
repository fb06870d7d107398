"""Published nccl-tests results for named machines, predicted from gradsync's nominal presets.

Reads docs/results/published_nccl.json, predicts every row (``gradsync.model.published``: the
forced algorithm's schedule at its fastest protocol, or the algorithm and protocol NCCL's own
cost model picks on that machine) and writes the table:

    python benchmarks/nccl_validation.py --out docs/results/nccl_validation.json
    python benchmarks/nccl_validation.py --markdown docs/results/nccl_validation.json

Nothing here is fitted: the presets take link counts and rates from datasheets, and the model
NCCL's own constants (docs/validation.md). busbw is nccl-tests' (algbw x 2 (N - 1) / N).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gradsync.model.published import error, markdown, predict, summarize

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "results" / "published_nccl.json"


def run(out: Path | None) -> dict:
    rows = json.loads(PUBLISHED.read_text())["rows"]
    results = []
    for row in rows:
        start = time.perf_counter()
        p = predict(row)
        p["error"], p["seconds_to_predict"] = error(row, p), time.perf_counter() - start
        results.append({**row, "prediction": p})
        print(f"{row['id']:<24} {p['predicted']:<18} {p['busbw_GBps']:8.1f} GB/s {p['time_us']:12.1f} us "
              f"{p['error']:+.1%}  ({p['seconds_to_predict']:.1f} s)", file=sys.stderr)
    summary = summarize(results)
    data = {"rows": results, "summary": summary}
    if out:
        out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="print the table of a stored result")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return
    data = run(args.out)
    print(json.dumps(data["summary"], indent=1))


if __name__ == "__main__":
    main()
