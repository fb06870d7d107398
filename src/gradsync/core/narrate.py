"""A schedule told in words: one sentence per round, for people learning how it works.

The sentences are derived from the transfers alone (who sends which chunk to whom, and
whether the receiver adds or overwrites), so they are true of any registered algorithm. A
round whose transfers follow a rule (every worker i sends chunk i - k to worker i + 1; all
send to one; one sends to all; pairs i and i XOR d swap) is stated as that rule; otherwise
the transfers are listed.
"""

from __future__ import annotations

import numpy as np

from .schedule import CODED, COPY, REDUCE, Schedule

MAX_LISTED = 8            # transfers spelled out per round

# what a receiver does, said of one receiver and one message, of several, and of a receiver in general
_VERBS = {REDUCE: ("adds it to its own", "add them to their own", "adds what it receives to its own"),
          COPY: ("stores it in place of its own", "store it in place of their own",
                 "stores what it receives in place of its own"),
          CODED: ("folds it into its next packet", "fold them into their next packets",
                  "folds what it receives into its next packet")}
_DEFAULT_PHASES = {REDUCE: "reduce", COPY: "gather", CODED: "coded exchange"}


def chunk_of(cuts: np.ndarray, offset: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunks [first, end) that each transfer's elements [offset, offset + count) touch,
    for a buffer cut into chunks at ``cuts`` (ascending, from 0 to the element count).

    >>> chunk_of(np.array([0, 10, 20, 30]), np.array([10, 0]), np.array([10, 30]))
    (array([1, 0]), array([2, 3]))
    """
    first = np.searchsorted(cuts, offset, side="right") - 1
    end = np.searchsorted(cuts, offset + np.maximum(count, 1), side="left")
    return first, np.maximum(end, first + 1)


def _chunks(first: int, end: int, total: int) -> str:
    if first == 0 and end == total and total > 1:
        return "the whole buffer"
    return f"chunk {first}" if end - first == 1 else f"chunks {first}-{end - 1}"


def _names(nodes, names) -> str:
    items = [names[i] for i in nodes]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _offset(k: int) -> str:
    return "i" if k == 0 else f"i + {k}" if k > 0 else f"i - {-k}"


def _rule(src, dst, first, end, op, workers, chunks, names) -> str | None:
    """The round as one rule over its senders, or None when no rule fits."""
    one, many, general = _VERBS[op]
    if op == CODED:
        if len(set(src.tolist())) == len(src) and np.all(dst == (src + 1) % workers):
            return f"every worker i sends its coded packet to worker i + 1 (mod {workers}), which {one}"
        return None
    if len(np.unique(dst)) == 1 and len(src) > 1:
        same = np.all(first == first[0]) and np.all(end == end[0])
        what = _chunks(int(first[0]), int(end[0]), chunks) if same else "its chunks"
        return f"{_names(src, names)} each send {what} to {names[dst[0]]}, which {general}"
    if len(np.unique(src)) == 1 and len(dst) > 1:
        same = np.all(first == first[0]) and np.all(end == end[0])
        what = _chunks(int(first[0]), int(end[0]), chunks) if same else "chunks"
        return f"{names[src[0]]} sends {what} to {_names(dst, names)}, which {many}"
    single = np.all(end - first == 1)
    all_to_all = len(src) == workers * (workers - 1) and len(set(zip(src.tolist(), dst.tolist()))) == len(src)
    if all_to_all and single and chunks == workers and np.all(first == dst):
        return f"every worker sends chunk j to worker j, the chunk's owner, which {general}"
    if all_to_all and single and chunks == workers and np.all(first == src):
        return f"every worker j sends its finished chunk j to all the others, which {many}"
    if all_to_all and np.all(first == 0) and np.all(end == chunks):
        return f"every worker sends its whole buffer to every other worker, which {general}"
    tree = _tree_rule(src, dst, first, end, chunks, names, one, many)
    if tree is not None:
        return tree
    full_round = len(src) == workers and len(set(src.tolist())) == workers and dst.max() < workers
    if not full_round:
        return None
    shift = (dst - src) % workers
    if np.all(shift == shift[0]) and single and chunks == workers:
        k = int((first[0] - src[0]) % workers)
        k = k - workers if k > workers // 2 else k
        if np.all((first - src) % workers == k % workers):
            step = int(shift[0])
            return (f"every worker i sends chunk {_offset(k)} to worker i + {step} (mod {workers}), "
                    f"which {one}")
    partner = src ^ dst
    if np.all(partner == partner[0]) and (partner[0] & (partner[0] - 1)) == 0:
        widths = end - first
        what = ("the chunk it gives away" if widths[0] == 1 else f"the {widths[0]} chunks it gives away") \
            if np.all(widths == widths[0]) else "the chunks it gives away"
        return f"every worker i swaps with worker i XOR {partner[0]}: each sends {what}, and the partner {general}"
    for size in range(2, workers):                        # a ring inside each group of consecutive workers
        if workers % size == 0 and np.all(dst == src - src % size + (src % size + 1) % size):
            return (f"inside each group of {size} consecutive workers, every worker sends one piece to the next "
                    f"worker of its group (the last to the first), which {one}")
    return None


def _tree_rule(src, dst, first, end, chunks, names, one, many) -> str | None:
    """Up or down a binary tree laid out as a heap (worker i's parent is (i - 1) // 2)."""
    same = np.all(first == first[0]) and np.all(end == end[0])
    what = _chunks(int(first[0]), int(end[0]), chunks) if same else None
    if len(set(src.tolist())) == len(src) and np.all(src > 0) and np.all(dst == (src - 1) // 2):
        senders, whose, where = src, "parent", "worker i to worker (i - 1) // 2"
        verb = one
    elif len(set(dst.tolist())) == len(dst) and np.all(dst > 0) and np.all(src == (dst - 1) // 2):
        senders, whose, where = np.unique(src), "children", "worker i to workers 2i + 1 and 2i + 2"
        verb = many
    else:
        return None
    if len(senders) == 1:
        return f"{_names(senders, names)} sends {what or 'its piece'} to its {whose} in the tree ({where}), which {verb}"
    return (f"{_names(senders, names)} each send {what or 'their piece'} to their {whose} in the tree ({where}), "
            f"which {verb}")


def narrate(schedule: Schedule, cuts, names=None, phases=None) -> list[dict]:
    """One entry per round: its phase, its step within that phase, and the sentence saying
    who sends which chunk to whom. ``cuts`` are the chunk boundaries (element offsets);
    ``names`` name the schedule's nodes (default "worker i"); ``phases`` map REDUCE, COPY
    and CODED to phase names (default reduce, gather, coded exchange).

    >>> from gradsync.algorithms import ring
    >>> s = ring.schedule(4, 8)
    >>> narrate(s, [0, 2, 4, 6, 8])[0]["text"]
    'reduce, step 1 of 3: every worker i sends chunk i to worker i + 1 (mod 4), which adds it to its own.'

    A compact schedule (``core.compact``) is told from its expanded table.
    """
    if hasattr(schedule, "expand"):        # a compact schedule
        schedule = schedule.expand()
    cuts = np.asarray(cuts, dtype=np.int64)
    chunks = len(cuts) - 1
    phases = {**_DEFAULT_PHASES, **(phases or {})}
    t = schedule.transfers
    nodes = int(max(t["src"].max(initial=0), t["dst"].max(initial=0))) + 1 if len(t) else schedule.workers
    names = list(names) if names is not None else [f"worker {i}" for i in range(max(nodes, schedule.workers))]
    coded = t["op"] == CODED
    first, end = chunk_of(cuts, t["offset"], t["count"])
    order = np.argsort(t["round"], kind="stable")
    rounds = np.unique(t["round"])
    steps = {op: np.unique(t["round"][t["op"] == op]).tolist() for op in (REDUCE, COPY, CODED)}
    out = []
    for r in rounds.tolist():
        idx = order[t["round"][order] == r]
        parts, heads = [], []
        for op in (REDUCE, COPY, CODED):
            sel = idx[t["op"][idx] == op]
            if not len(sel):
                continue
            k, total = steps[op].index(r) + 1, len(steps[op])
            heads.append(f"{phases[op]}, step {k} of {total}")
            src, dst = t["src"][sel], t["dst"][sel]
            rule = _rule(src, dst, first[sel], end[sel], op, schedule.workers, chunks, names)
            listed = [f"{names[s]} -> {names[d]}: " + ("coded packet" if coded[i] else _chunks(int(first[i]), int(end[i]), chunks))
                      for i, s, d in zip(sel.tolist(), src.tolist(), dst.tolist())][:MAX_LISTED]
            more = f", and {len(sel) - MAX_LISTED} more" if len(sel) > MAX_LISTED else ""
            if rule is None:
                rule = f"{len(sel)} transfer{'s' if len(sel) > 1 else ''}; each receiver {_VERBS[op][2]}"
            parts.append({"op": op, "rule": rule, "transfers": "; ".join(listed) + more})
        text = " and ".join(heads) + ": " + "; ".join(p["rule"] for p in parts) + "."
        out.append({"round": r, "phase": " + ".join(h.split(",")[0] for h in heads), "text": text,
                    "transfers": " | ".join(p["transfers"] for p in parts)})
    return out
