"""The rings' clauses of the narration: a round whose transfers are a permutation of the
workers, in one cycle through all of them (in order, or around a listed ring), one cycle per
machine, or the rails across machines. The sentence forms are listed in ``narrate_rules``,
beside the clauses of every other shape; ``Piece`` is the chunk a sender moves, as an
expression of its index, position or local rank.

>>> from gradsync.core.narrate_rules import Group
>>> g = Group(0, np.array([0, 1, 2]), np.array([1, 2, 0]), np.array([0, 1, 2]), np.array([1, 2, 3]), 3, 3,
...           ["a", "b", "c"])
>>> ring(g)
'every worker i sends chunk i to worker i + 1 (mod 3), which adds it to its own'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .narrate_rules import VERBS, Group, checked, offset_text, shift_offset
from .schedule import CODED

def cycles(g: Group) -> list[list[int]] | None:
    """The cycles of sender -> receiver, each from its lowest worker; None unless every
    sender sends once and receives once."""
    src, dst = g.src.tolist(), g.dst.tolist()
    if len(set(src)) != len(src) or set(src) != set(dst) or max(src) >= g.workers:
        return None
    after, out, seen = dict(zip(src, dst)), [], set()
    for s in sorted(after):
        if s not in seen:
            ring, x = [s], after[s]
            while x != s:
                ring.append(x)
                x = after[x]
            seen.update(ring)
            out.append(ring)
    return out


@dataclass(frozen=True)
class Piece:
    """The piece a sender moves: (variable + offset) mod period, in a region of the buffer
    that starts at chunk ``start`` and is cut in ``period`` parts of ``width`` chunks."""

    start: int
    width: int
    period: int
    offset: int

    def words(self, var: str, chunks: int) -> str:
        e = offset_text(var, self.offset)
        if self.start == 0 and self.period * self.width == chunks:
            return f"chunk {e}" if self.width == 1 else f"part {e} of {self.period}"
        region = f"chunks {self.start}-{self.start + self.period * self.width - 1}"
        if self.width == 1:
            return f"chunk {e} (mod {self.period}) of {region}"
        return f"part {e} (mod {self.period}) of {region} cut in {self.period}"

    def cells(self, value: int) -> tuple[int, int]:
        a = self.start + (value + self.offset) % self.period * self.width
        return a, a + self.width


def piece(g: Group, value: np.ndarray, period: int, step: int) -> Piece | None:
    """The piece as a function of each sender's ``value`` (its index, position or rank)."""
    widths = set((g.end - g.first).tolist())
    if len(widths) != 1:
        return None
    w, a = widths.pop(), int(g.first.min())
    idx, rest = np.divmod(g.first - a, w)
    if rest.any() or (idx >= period).any() or a + period * w > g.chunks:
        return None
    o = set(((idx - value) % period).tolist())
    return Piece(a, w, period, shift_offset(o.pop(), period, step)) if len(o) == 1 else None


def _signed(s: int, n: int) -> int:
    return s - n if s > n // 2 else s


def ring(g: Group) -> str | None:
    """One cycle through every worker: in order (i to i + s) or around a listed ring."""
    found, n, one = cycles(g), g.workers, VERBS[g.op][0]
    if found is None or len(found) != 1 or len(found[0]) != n or g.op == CODED:
        return None
    steps = set(((g.dst - g.src) % n).tolist())
    if len(steps) == 1:
        s = _signed(steps.pop(), n)
        p = piece(g, g.src, n, 1 if s > 0 else -1)
        if p is not None:
            text = f"every worker i sends {p.words('i', g.chunks)} to worker {offset_text('i', s)} (mod {n}), which {one}"
            return checked(g, [(i, (i + s) % n) + p.cells(i) for i in range(n)], text)
    order = found[0]
    position = {x: k for k, x in enumerate(order)}
    p = piece(g, np.array([position[x] for x in g.src.tolist()]), n, 1)
    if p is None:
        return None
    path = " -> ".join(g.names[x] for x in order + order[:1])
    text = f"around the ring {path}, the worker at position p sends {p.words('p', g.chunks)} to the next, which {one}"
    return checked(g, [(x, order[(k + 1) % n]) + p.cells(k) for k, x in enumerate(order)], text)


def _groups(g: Group, size: int) -> str:
    return f"machine of {size} workers" if g.machine == size else f"group of {size} consecutive workers"


def local_rings(g: Group) -> str | None:
    """A ring inside each group of L consecutive workers (a machine), all at once."""
    found, n = cycles(g), g.workers
    if found is None or len(found) < 2 or g.op == CODED:
        return None
    size = len(found[0])
    if n % size or len(found) != n // size or any(sorted(c) != list(range(c[0], c[0] + size)) for c in found):
        return None
    steps = set(((g.dst % size - g.src % size) % size).tolist())
    if len(steps) != 1:
        return None
    s = _signed(steps.pop(), size)
    p = piece(g, g.src % size, size, 1 if s > 0 else -1)
    if p is None:
        return None
    text = (f"inside each {_groups(g, size)}, the worker at local rank l sends {p.words('l', g.chunks)} to local rank "
            f"{offset_text('l', s)} (mod {size}) of its {'machine' if g.machine == size else 'group'}, which {VERBS[g.op][0]}")
    claims = [(i, i - i % size + (i % size + s) % size) + p.cells(i % size) for i in range(n)]
    return checked(g, claims, text)


def rails(g: Group) -> str | None:
    """Across groups of L consecutive workers (machines): worker l of group m sends to worker l
    of group m + s, all rails at once; the piece depends on the rail (l) and the group (m)."""
    found, n = cycles(g), g.workers
    if found is None or len(found) < 2 or g.op == CODED:
        return None
    machines = len(found[0])
    size = n // machines
    if n % machines or len(found) != size or any(c != [c[0] + k * size for k in range(machines)]
                                                  for c in (sorted(c) for c in found)):
        return None
    steps = set(((g.dst // size - g.src // size) % machines).tolist())
    cells = g.chunks // (size * machines)
    if len(steps) != 1 or (g.end - g.first != cells).any() or cells * size * machines != g.chunks:
        return None
    s = _signed(steps.pop(), machines)
    part, pc = np.divmod(g.first // cells, machines)
    o1, o2 = set(((part - g.src % size) % size).tolist()), set(((pc - g.src // size) % machines).tolist())
    if len(o1) != 1 or len(o2) != 1:
        return None
    o1, o2 = shift_offset(o1.pop(), size, 1), shift_offset(o2.pop(), machines, 1 if s > 0 else -1)
    kind = "machine" if g.machine == size else "group"
    text = (f"across {kind}s, the worker at local rank l of {kind} m sends piece {offset_text('m', o2)} of part "
            f"{offset_text('l', o1)} (the buffer in {size} parts of {machines} pieces) to local rank l of {kind} "
            f"{offset_text('m', s)} (mod {machines}), which {VERBS[g.op][0]}")
    claims = []
    for i in range(n):
        a = (((i % size + o1) % size) * machines + (i // size + o2) % machines) * cells
        claims.append((i, (i + s * size) % n, a, a + cells))
    return checked(g, claims, text)
