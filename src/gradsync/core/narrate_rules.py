"""How one group of a round's transfers (one kind: reduce, copy or coded) is told in words
(the rings' clauses, whose transfers are a permutation of the workers, in ``narrate_rings``).

Each rule proposes a clause and the exact transfers the clause claims (sender, receiver, and
the chunks [first, end) moved); the clause is used only when that set equals the group's
transfers, so nothing is said that the schedule does not do. What no rule states is listed.

The clauses, with i a worker's index, p its position on a listed ring, l its rank inside a
machine of L consecutive workers and m its machine:

- ``A sends S to B, which ...`` (one transfer); ``A, B and C each send S to D`` (gather);
  ``A sends S to B, C and D`` (scatter); ``every worker`` and ``every worker but A`` name
  groups, and ``A to B`` a run of consecutive workers;
- ``every worker sends its whole buffer to every other worker``;
- ``every worker sends chunk j to worker j, for every j but its own`` (to the chunk's owner),
  and ``every worker j sends chunk j to every other worker`` (from it);
- ``... to their parent in the tree (worker i to worker (i - 1) // 2)`` and ``... to their
  children in the tree (worker i to workers 2i + 1 and 2i + 2, those that exist)``;
- ``every worker i sends chunk i - 2 to worker i + 1 (mod 8)``; ``around the ring A -> B ->
  C -> A, the worker at position p sends ...``; ``inside each machine of L workers, the worker
  at local rank l sends ... to local rank l + 1 (mod L)``; ``across machines, the worker at
  local rank l of machine m sends ... to local rank l of machine m + 1 (mod M)``;
- ``along the chain A -> B -> C, the worker at position p (from 0) sends chunk 7 - p to the
  next`` (a pipeline along a path);
- ``every worker i swaps with worker i XOR 4: each sends 2 chunks (listed below)``;
- ``every worker i sends its coded packet to worker i + 1 (mod N)``.

A piece of the buffer is ``chunk E`` (E an expression of i, p or l, modulo the ring's
length), ``part E of P`` (the buffer cut in P equal parts of several chunks), ``chunk E (mod
P) of chunks a-b`` or ``part E (mod P) of chunks a-b cut in P`` (counted from chunk a: a ring
that carries only a region, as each of several rings does), and ``piece E2 of part E1 (the
buffer in P1 parts of P2 pieces)`` on the rails across machines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schedule import CODED, COPY, REDUCE

LISTED = 12          # transfers spelled out in a sentence; the rest are in the round's list

# what a receiver does: said of one receiver and one message, of several, and in general
VERBS = {REDUCE: ("adds it to its own", "add it to their own", "adds what it receives to its own"),
         COPY: ("stores it in place of its own", "store it in place of their own",
                "stores what it receives in place of its own"),
         CODED: ("folds it into its next packet", "fold it into their next packets",
                 "folds what it receives into its next packet")}


@dataclass(frozen=True)
class Group:
    """The transfers of one kind in one round: their ends and the chunks [first, end) each
    touches, the schedule's workers, the chunks the buffer is drawn in and the nodes' names."""

    op: int
    src: np.ndarray
    dst: np.ndarray
    first: np.ndarray
    end: np.ndarray
    workers: int
    chunks: int
    names: list
    machine: int | None = None      # workers per machine (consecutive ranks), if known

    def rows(self) -> list[tuple]:
        """(src, dst, first, end) of each transfer, sorted; computed once (every rule compares its claims with it)."""
        if "_rows" not in self.__dict__:
            object.__setattr__(self, "_rows", sorted(zip(self.src.tolist(), self.dst.tolist(), self.first.tolist(),
                                                         self.end.tolist())))
        return self.__dict__["_rows"]

    def part(self, keep: np.ndarray) -> "Group":
        return Group(self.op, self.src[keep], self.dst[keep], self.first[keep], self.end[keep], self.workers,
                     self.chunks, self.names, self.machine)


def span(first: int, end: int, chunks: int) -> str:
    """``span(0, 4, 4)`` is 'the whole buffer'; ``span(2, 3, 4)`` 'chunk 2'; ``span(1, 3, 4)`` 'chunks 1-2'."""
    if first == 0 and end == chunks:
        return "the whole buffer"
    return f"chunk {first}" if end - first == 1 else f"chunks {first}-{end - 1}"


def who(nodes, names, workers: int) -> str:
    """A set of nodes in words: ``every worker``, ``every worker but A``, or names with runs of
    five or more consecutive nodes written ``A to B``.

    >>> who([0, 1, 2, 3, 4, 6], [f"w{i}" for i in range(8)], 8)
    'w0 to w4 and w6'
    """
    nodes = sorted(set(int(x) for x in nodes))
    if nodes == list(range(workers)):
        return "every worker"
    if len(nodes) == workers - 1 and workers > 2 and nodes[-1] < workers:
        missing = (set(range(workers)) - set(nodes)).pop()
        return f"every worker but {names[missing]}"
    runs, start = [], 0
    for k in range(1, len(nodes) + 1):
        if k == len(nodes) or nodes[k] != nodes[k - 1] + 1:
            run = nodes[start:k]
            runs += [f"{names[run[0]]} to {names[run[-1]]}"] if len(run) >= 5 else [names[x] for x in run]
            start = k
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


def plural(nodes) -> bool:
    return len(set(int(x) for x in nodes)) > 1


def offset_text(var: str, k: int) -> str:
    return var if k == 0 else f"{var} + {k}" if k > 0 else f"{var} - {-k}"


def shift_offset(o: int, period: int, step: int) -> int:
    """``o`` (mod ``period``) in one fixed window per direction of travel, so a phase's offsets
    run i, i - 1, i - 2, ... without changing sign halfway: [2 - P, 1] going up, [-1, P - 2] down."""
    low = 2 - period if step > 0 else -1
    return (o - low) % period + low


def checked(group: Group, claims, text: str) -> str | None:
    """``text`` if the transfers it claims are exactly the group's, else None."""
    return text if len(claims) == len(group.src) and sorted(claims) == group.rows() else None


def _same_span(g: Group) -> tuple[int, int] | None:
    if len(g.first) and (g.first == g.first[0]).all() and (g.end == g.end[0]).all():
        return int(g.first[0]), int(g.end[0])
    return None


def single(g: Group) -> str | None:
    if len(g.src) != 1:
        return None
    s, d, a, b = g.rows()[0]
    return f"{g.names[s]} sends {span(a, b, g.chunks)} to {g.names[d]}, which {VERBS[g.op][0]}"


def gather(g: Group) -> str | None:
    same = _same_span(g)
    if same is None or len(np.unique(g.dst)) != 1 or len(g.src) < 2:
        return None
    d, senders = int(g.dst[0]), who(g.src, g.names, g.workers)
    verb = "sends" if senders.startswith("every worker") else "each send"
    text = f"{senders} {verb} {span(*same, g.chunks)} to {g.names[d]}, which {VERBS[g.op][2]}"
    return checked(g, [(int(s), d) + same for s in g.src], text)


def scatter(g: Group) -> str | None:
    same = _same_span(g)
    if same is None or len(np.unique(g.src)) != 1 or len(g.dst) < 2:
        return None
    s = int(g.src[0])
    text = f"{g.names[s]} sends {span(*same, g.chunks)} to {who(g.dst, g.names, g.workers)}, which {VERBS[g.op][1]}"
    return checked(g, [(s, int(d)) + same for d in g.dst], text)


def everyone(g: Group) -> str | None:
    """All to all: the whole buffer, or each chunk to or from its owner (chunk j, worker j)."""
    n, k = g.workers, g.chunks
    if len(g.src) != n * (n - 1) or g.op == CODED:
        return None
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    verb = VERBS[g.op]
    found = checked(g, [(i, j, 0, k) for i, j in pairs],
                    f"every worker sends its whole buffer to every other worker, which {verb[2]}")
    if found or k % n:
        return found
    w = k // n
    piece = "chunk j" if w == 1 else f"part j of {n}"
    return checked(g, [(i, j, j * w, j * w + w) for i, j in pairs],
                   f"every worker sends {piece} to worker j, for every j but its own, and worker j {verb[2]}") or \
        checked(g, [(j, i, j * w, j * w + w) for i, j in pairs],
                f"every worker j sends {piece} to every other worker, which {verb[0]}")


def tree(g: Group) -> str | None:
    """Up or down a binary tree laid out as a heap (worker i's parent is (i - 1) // 2)."""
    same = _same_span(g)
    if same is None or g.op == CODED or (g.src >= g.workers).any() or (g.dst >= g.workers).any():
        return None
    what, verb = span(*same, g.chunks), VERBS[g.op]
    senders = sorted(set(g.src.tolist()))
    many = plural(senders)
    up = [(s, (s - 1) // 2) + same for s in senders if s > 0]
    text = (f"{who(senders, g.names, g.workers)} {'each send' if many else 'sends'} {what} to "
            f"{'their' if many else 'its'} parent in the tree (worker i to worker (i - 1) // 2), which {verb[0]}")
    if len(up) == len(senders) and checked(g, up, text):
        return text
    down = [(s, c) + same for s in senders for c in (2 * s + 1, 2 * s + 2) if c < g.workers]
    text = (f"{who(senders, g.names, g.workers)} {'each send' if many else 'sends'} {what} to "
            f"{'their' if many else 'its'} children in the tree (worker i to workers 2i + 1 and 2i + 2, "
            f"those that exist), which {verb[1]}")
    return checked(g, down, text)


def pipeline(g: Group) -> str | None:
    """Up or down the heap-ordered tree with a different piece per sender (a pipelined tree
    moves several segments at once): one clause, then which chunks come from whom."""
    if g.op == CODED or (g.src >= g.workers).any() or (g.dst >= g.workers).any():
        return None
    spans = {}
    for s, a, b in zip(g.src.tolist(), g.first.tolist(), g.end.tolist()):
        spans.setdefault(s, set()).add((a, b))
    if any(len(v) != 1 for v in spans.values()) or len({next(iter(v)) for v in spans.values()}) < 2:
        return None
    senders = sorted(spans)
    by_span = {}
    for s in senders:
        by_span.setdefault(next(iter(spans[s])), []).append(s)
    pieces = ", ".join(f"{span(a, b, g.chunks)} from {who(ss, g.names, g.workers)}" for (a, b), ss in sorted(by_span.items()))
    everyone, verb = who(senders, g.names, g.workers), VERBS[g.op]
    one = everyone.startswith("every worker")
    sends, their = ("sends", "its") if one else ("each send", "their")
    up = [(s, (s - 1) // 2) + next(iter(spans[s])) for s in senders if s > 0]
    text = (f"{everyone} {sends} to {their} parent in the tree (worker i to worker (i - 1) // 2), which {verb[0]}: {pieces}")
    if len(up) == len(senders) and checked(g, up, text):
        return text
    down = [(s, c) + next(iter(spans[s])) for s in senders for c in (2 * s + 1, 2 * s + 2) if c < g.workers]
    return checked(g, down, f"{everyone} {sends} to {their} children in the tree (worker i to workers 2i + 1 and 2i + 2, "
                            f"those that exist), which {verb[1]}: {pieces}")


def _path_words(order: list[int], names) -> str:
    """A path's nodes joined by arrows; a run of five or more consecutive workers shortened."""
    step = order[1] - order[0] if len(order) > 1 else 0
    if len(order) >= 5 and abs(step) == 1 and all(b - a == step for a, b in zip(order, order[1:])):
        return f"{names[order[0]]} -> {names[order[1]]} -> ... -> {names[order[-1]]}"
    return " -> ".join(names[x] for x in order)


def chain(g: Group) -> str | None:
    """Along one path, or several of one length side by side (one per machine), each sender
    passing a different piece on (a pipeline along a chain, as NCCL's trees run inside
    machines): the sender at position p of each path moves chunk a + p or a - p."""
    if g.op == CODED or len(g.src) < 2 or (g.src >= g.workers).any() or (g.dst >= g.workers).any():
        return None
    src, dst = g.src.tolist(), g.dst.tolist()
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        return None
    after, paths = dict(zip(src, dst)), []
    for start in sorted(set(src) - set(dst)):
        order = [start]
        while order[-1] in after and len(order) <= len(src):
            order.append(after[order[-1]])
        paths.append(order)
    widths = set((g.end - g.first).tolist())
    if not paths or sum(len(p) - 1 for p in paths) != len(src) or len({len(p) for p in paths}) != 1 \
            or len(paths[0]) < 3 or len(widths) != 1:
        return None
    w, first = widths.pop(), dict(zip(src, g.first.tolist()))
    a, step = first[paths[0][0]], (first[paths[0][1]] - first[paths[0][0]]) // w
    if abs(step) != 1:
        return None
    sign = "+" if step > 0 else "-"
    what = f"chunk {a} {sign} p" if w == 1 else f"chunks {a} {sign} {w}p to {a + w - 1} {sign} {w}p"
    size = g.machine
    if size and len(paths) > 1 and len(paths) * size == g.workers \
            and all(len({x // size for x in p}) == 1 for p in paths) and len({tuple(x % size for x in p) for p in paths}) == 1:
        where = (f"inside each machine of {size} workers, along the chain of local ranks "     # one chain per machine,
                 + " -> ".join(str(x % size) for x in paths[0]))                              # the same in each
    elif len(paths) == 1:
        where = f"along the chain {_path_words(paths[0], g.names)}"
    else:
        where = "along each chain (" + ", ".join(_path_words(p, g.names) for p in paths) + ")"
    text = f"{where}, the worker at position p (from 0) sends {what} to the next, which {VERBS[g.op][0]}"
    claims = [(x, path[p + 1], a + step * w * p, a + step * w * p + w) for path in paths
              for p, x in enumerate(path[:-1])]
    return checked(g, claims, text)


def xor(g: Group) -> str | None:
    """Pairs that differ in one bit swap pieces of one width (recursive halving, doubling)."""
    n = g.workers
    if len(g.src) != n or sorted(g.src.tolist()) != list(range(n)) or g.op == CODED:
        return None
    d = int(g.src[0] ^ g.dst[0])
    widths = set((g.end - g.first).tolist())
    if d <= 0 or d & (d - 1) or len(widths) != 1 or ((g.src ^ g.dst) != d).any():
        return None
    w = widths.pop()
    what = "the whole buffer" if w == g.chunks else f"{w} chunk{'s' if w > 1 else ''} (listed below)"
    return f"every worker i swaps with worker i XOR {d}: each sends {what}, and the partner {VERBS[g.op][2]}"


def coded(g: Group) -> str | None:
    n = g.workers
    if g.op != CODED:
        return None
    return checked(g, [(i, (i + 1) % n, 0, g.chunks) for i in range(n)],
                   f"every worker i sends its coded packet to worker i + 1 (mod {n}), which {VERBS[CODED][0]}")


def listing(g: Group) -> str:
    """The transfers one by one (the first LISTED; the rest are in the round's list)."""
    rows = g.rows()
    items = [f"{g.names[s]} sends {span(a, b, g.chunks)} to {g.names[d]}" for s, d, a, b in rows[:LISTED]]
    more = f", and {len(rows) - LISTED} more (listed below)" if len(rows) > LISTED else ""
    return f"{len(rows)} transfers: " + ", ".join(items) + more + f", each receiver {VERBS[g.op][2]}"
