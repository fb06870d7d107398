"""``verify`` for a compact schedule, read from its program and group without expanding it.

The expanded table is the program rotated by every group element, and the inputs (worker w
holds input w) rotate with it, so the schedule run on a chunk and run on any rotation of that
chunk are the same run, relabelled. The check therefore runs the schedule on one **cell** (a
chunk with every digit given: the finest split of the buffer) of each orbit of cells under the
group, and only on the rotated transfers that move that cell, which it finds by solving each
program row's digit congruences for the group element instead of trying every one. A ring on
65,536 workers is 131,070 transfers on one cell instead of 8.6e9 in the table.

What it checks is what ``core.schedule.verify`` checks: endpoints and segments (on the program,
which rotations keep), no two transfers of a round writing one cell of one node with a copy
involved, nothing sent before anything has arrived in it, and every worker ending with every
worker's input exactly once. What each node holds of the cell is kept as a count of inputs and
three sums of random weights of them modulo 2^31 - 1, not as a set: counts are exact (a read
before arrival, a count above N), and a wrong set with the right count passes the three sums
with probability below 2^-90. An input added twice and later overwritten by a copy of a right
sum is not caught (the result is right; the set check would name it).

Schedules whose digits this reading does not cover (a given digit after a whole level, a
level's parts not dividing its dimension, empty cells at tiny sizes) are checked on the table.

>>> from gradsync.algorithms import ring
>>> verify(ring.compact(65536, 10**9))
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from .schedule import COPY, OP_NAMES, REDUCE, ScheduleError, verify as verify_table

PRIME = 2**31 - 1
SUMS = 3
MAX_CELLS = 1 << 24


def verify(c) -> None:
    """Check compact schedule ``c``; raise ``ScheduleError`` naming the first problem found."""
    _check_program(c)
    if not _readable(c):
        verify_table(c.expand())
        return
    rng = np.random.default_rng(0x9A7D)
    weights = rng.integers(1, PRIME, size=(c.workers, SUMS), dtype=np.int64)
    for cell in _orbit_cells(c):
        _run_cell(c, cell, weights)


def _check_program(c) -> None:
    p = c.program
    bad = ((p["src"] < 0) | (p["src"] >= c.nodes) | (p["dst"] < 0) | (p["dst"] >= c.nodes)
           | (p["src"] == p["dst"]) | ~np.isin(p["op"], (REDUCE, COPY)) | (p["round"] < 0))
    if c.workers < 1 or c.elements < 0:
        raise ScheduleError(f"need workers >= 1 and elements >= 0, got {c.workers} and {c.elements}")
    if bad.any():
        i = int(np.argmax(bad))
        raise ScheduleError(f"program row {i} (round {p['round'][i]}, {p['src'][i]} -> {p['dst'][i]}): endpoints "
                            f"must be distinct nodes in 0..{c.nodes - 1}, ops reduce or copy")


def _readable(c) -> bool:
    """Whether every transfer covers whole cells given by a prefix of its digits."""
    given = c.digits >= 0
    prefix = (given[:, 1:] <= given[:, :-1]).all() if c.digits.shape[1] > 1 else True
    divides = all(dim < 0 or c.shape[dim] % parts == 0 for dim, parts in c.levels)
    cells = int(np.prod([parts for _, parts in c.levels], dtype=np.int64))
    sizes = c.level_sizes()
    empty = c.count_class is None and bool(sizes) and sizes[-1][0] < 1
    return bool(prefix and divides and not empty and cells <= MAX_CELLS and len(c.program))


def _orbit_cells(c) -> np.ndarray:
    """One cell (a row of digits) per orbit of the group on cells."""
    parts = np.array([p for _, p in c.levels], np.int64)
    count = int(np.prod(parts))
    cells = np.stack(np.unravel_index(np.arange(count), parts), axis=-1).astype(np.int64) if len(parts) else \
        np.zeros((1, 0), np.int64)
    rows, cols = [], []
    for dim in range(len(c.shape)):
        step = np.zeros(len(c.shape), np.int64)
        step[dim] = 1
        moved = c.rotate_digits(cells, step[None, :])
        rows.append(np.arange(count))
        cols.append(np.ravel_multi_index(moved.T, parts) if len(parts) else np.zeros(count, np.int64))
    if not rows:
        return cells
    r, k = np.concatenate(rows), np.concatenate(cols)
    _, label = connected_components(coo_matrix((np.ones(len(r)), (r, k)), shape=(count, count)), directed=False)
    _, first = np.unique(label, return_index=True)
    return cells[first]


def _touching(c, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The program rows and group elements (rows of digits) of every rotated transfer that
    moves ``cell``."""
    digits = c.digits
    given = digits >= 0
    fixed_ok = np.ones(len(digits), bool)
    for k, (dim, _) in enumerate(c.levels):
        if dim < 0:
            fixed_ok &= ~given[:, k] | (digits[:, k] == cell[k])
    rows_out, g_out = [], []
    for n in np.unique(given.sum(axis=1)):
        rows = np.flatnonzero(fixed_ok & (given.sum(axis=1) == n))
        if len(rows):
            r, g = _solve(c, cell, rows, int(n))
            rows_out.append(r)
            g_out.append(g)
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros((0, len(c.shape)), np.int64)
    return np.concatenate(rows_out), np.concatenate(g_out)


def _solve(c, cell, rows, n):
    """For program ``rows`` whose first ``n`` digits are given: each group element g with
    rotate(digits, g) == cell on those levels (per dimension, the first level's congruence
    gives candidates, the others filter them)."""
    axes, shapes = [], []
    for dim, size in enumerate(c.shape):
        levels = [k for k in range(n) if c.levels[k][0] == dim]
        if not levels:
            cand = np.broadcast_to(np.arange(size, dtype=np.int64), (len(rows), size))
        else:
            k1, p1 = levels[0], c.levels[levels[0]][1]
            a = (cell[k1] - c.digits[rows, k1]) % p1
            cand = a[:, None] + p1 * np.arange(size // p1, dtype=np.int64)[None, :]
        ok = np.ones(cand.shape, bool)
        for k in levels[1:]:
            ok &= (c.digits[rows, k][:, None] + cand) % c.levels[k][1] == cell[k]
        axes.append((cand, ok))
        shapes.append(cand.shape[1])
    full = (len(rows),) + tuple(shapes)
    mask = np.ones(full, bool)
    for d, (_, ok) in enumerate(axes):
        mask &= ok.reshape((len(rows),) + tuple(s if i == d else 1 for i, s in enumerate(shapes)))
    hit = np.nonzero(mask)
    g = np.stack([axes[d][0][hit[0], hit[d + 1]] for d in range(len(shapes))], axis=-1) if shapes else \
        np.zeros((len(hit[0]), 0), np.int64)
    return rows[hit[0]], g.astype(np.int64)


def _run_cell(c, cell, weights) -> None:
    """Run every transfer that moves ``cell`` on what each node holds of it (plain Python over
    the cell's transfers: most rounds move a cell once)."""
    rows, g = _touching(c, cell)
    p = c.program
    order = np.argsort(p["round"][rows], kind="stable")
    rows, g = rows[order], g[order]
    src, dst = c.rotate(p["src"][rows], g).tolist(), c.rotate(p["dst"][rows], g).tolist()
    rnd, op = p["round"][rows].tolist(), p["op"][rows].tolist()
    held = [(1, *w) for w in weights.tolist()] + [(0,) + (0,) * SUMS] * (c.nodes - c.workers)
    where = f"cell {cell.tolist()}"
    lo = 0
    while lo < len(rnd):
        hi = lo + 1
        while hi < len(rnd) and rnd[hi] == rnd[lo]:
            hi += 1
        _round(c.workers, held, src[lo:hi], dst[lo:hi], op[lo:hi], rnd[lo], where)
        lo = hi
    total = tuple((weights.sum(axis=0) % PRIME).tolist())
    for w in range(c.workers):
        if held[w][0] != c.workers or held[w][1:] != total:
            raise ScheduleError(f"worker {w} ends with {held[w][0]} of the {c.workers} inputs in {where}"
                                + ("" if held[w][0] != c.workers else ", not each exactly once"))


def _round(workers, held, src, dst, op, rnd, where) -> None:
    """One round's transfers of the cell: payloads read before any lands (as the table's check)."""
    if len(dst) > 1:
        copied = {d for d, o in zip(dst, op) if o == COPY}
        if copied and (len(set(dst)) < len(dst)):
            seen = set()
            for s, d, o in zip(src, dst, op):
                if d in seen and d in copied:
                    _fail(rnd, s, d, o, where, "another transfer of the same round writes the same "
                          "elements of this node with a copy")
                seen.add(d)
    payloads = [held[s] for s in src]
    for s, d, o, pay in zip(src, dst, op, payloads):
        if pay[0] == 0:
            _fail(rnd, s, d, o, where, "sends elements that hold no input yet (read before arrival)")
        if o == COPY:
            held[d] = pay
            continue
        have = held[d]
        if have[0] + pay[0] > workers:
            _fail(rnd, s, d, o, where, "an input would be counted twice")
        held[d] = (have[0] + pay[0],) + tuple((a + b) % PRIME for a, b in zip(have[1:], pay[1:]))


def _fail(rnd, src, dst, op, where, msg):
    raise ScheduleError(f"round {rnd}: transfer {src} -> {dst} {OP_NAMES[op]} of {where}: {msg}")
