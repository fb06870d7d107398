"""A schedule told in words: one sentence per round, for people learning how it works.

Each sentence is derived from that round's transfers alone (who sends which chunk to whom,
and whether the receiver adds, overwrites or folds it into a coded packet), so it is true of
any schedule, whatever algorithm built it. Its clauses come from ``narrate_rules`` and
``narrate_rings``, each used only when the transfers it claims are exactly the round's; a
round with transfers of several kinds (a pipelined tree reduces and broadcasts at once) gets
a clause per kind, and several rings running at once (channels) a clause per ring; a
schedule whose lanes the algorithm names (NCCL's trees, its rings) a clause per lane, under
the algorithm's word for it.

Phases and steps: a phase is a run of rounds of one kind of transfer that move the whole
buffer or parts of it, inside machines or across them (when ``machine_size`` is given); its
name is the algorithm's own (``phases``) for the longest such run of each kind, or for the
runs at a level where it names them ("reduce up the chains" inside machines), and what the
transfers do otherwise ("whole-buffer reduce", "reduce-scatter inside each machine", ...).

A compact schedule (``core.compact``) is read round by round from its program and group,
never expanded to its full table: ask for the ``rounds`` you want at cluster scale.
"""

from __future__ import annotations

import numpy as np

from . import narrate_rings as rings
from . import narrate_rules as rules
from .schedule import CODED, COPY, REDUCE, Schedule

MAX_DETAIL = 64           # transfers spelled out in a round's list
_DEFAULT_PHASES = {REDUCE: "reduce", COPY: "gather", CODED: "coded exchange"}
_WHOLE = {REDUCE: ("whole-buffer reduce", "reduce-scatter"), COPY: ("whole-buffer copy", "all-gather"),
          CODED: ("coded exchange", "coded exchange")}
_WHOLE_MAIN = {REDUCE: "reduce", COPY: "broadcast", CODED: "coded exchange"}
RULES = (rules.single, rules.everyone, rules.coded, rules.gather, rules.scatter, rings.ring, rings.local_rings,
         rings.rails, rules.xor, rules.tree, rules.pipeline, rules.chain)


def chunk_of(cuts: np.ndarray, offset: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunks [first, end) that each transfer's elements [offset, offset + count) touch,
    for a buffer cut into chunks at ``cuts`` (ascending, from 0 to the element count).

    >>> chunk_of(np.array([0, 10, 20, 30]), np.array([10, 0]), np.array([10, 30]))
    (array([1, 0]), array([2, 3]))
    """
    first = np.searchsorted(cuts, offset, side="right") - 1
    end = np.searchsorted(cuts, offset + np.maximum(count, 1), side="left")
    return first, np.maximum(end, first + 1)


class _Rounds:
    """A schedule's transfers round by round: slices of its table, or a compact schedule's
    program rows of the round moved by every element of its group (never the whole table)."""

    def __init__(self, schedule):
        self.s = schedule
        self.compact = hasattr(schedule, "program")
        if self.compact:
            p = schedule.program
            self.starts = np.searchsorted(p["round"], np.arange(schedule.rounds + 1))
        else:
            self.starts = schedule.round_starts

    def kinds(self, r: int, machine_size) -> dict:
        """Per kind of transfer in round r: (whether every one moves the whole buffer, its
        level); for a compact schedule without machines, from its program alone."""
        if not self.compact or machine_size:
            return _kinds(self.get(r), self.s.elements, self.s.workers, machine_size)
        if not hasattr(self, "_whole"):              # per (round, op): present, every row whole
            p, whole = self.s.program, (self.s.digits < 0).all(axis=1)
            shape = (self.s.rounds, 3)
            self._present = np.zeros(shape, bool)
            self._present[p["round"], p["op"]] = True
            self._whole = np.ones(shape, bool)
            np.logical_and.at(self._whole, (p["round"], p["op"]), whole)
        return {op: (bool(self._whole[r, op]), None) for op in (REDUCE, COPY, CODED) if self._present[r, op]}

    def get(self, r: int) -> dict:
        lo, hi = int(self.starts[r]), int(self.starts[r + 1])
        if not self.compact:
            t = self.s.transfers[lo:hi]
            out = {k: t[k] for k in ("src", "dst", "offset", "count", "op")}
            if "channel" in (t.dtype.names or ()):
                out["channel"] = t["channel"]
            if self.s.lane is not None:
                out["lane"] = self.s.lane[lo:hi]
            return out
        c = self.s
        g = c.elements_of(c.shape)[None, :, :]
        rows = c.program[lo:hi][:, None]
        moved = c.rotate_digits(c.digits[lo:hi][:, None, :], g).reshape(-1, len(c.levels))
        offset, count = c.segments(moved)
        shape = (hi - lo, g.shape[1])
        return {"src": c.rotate(rows["src"], g).ravel(), "dst": c.rotate(rows["dst"], g).ravel(),
                "offset": offset, "count": count, "op": np.broadcast_to(rows["op"], shape).ravel()}


def _level(t: dict, sel: np.ndarray, workers: int, machine_size: int | None) -> str | None:
    """Whether the selected transfers all stay inside a machine, all cross machines, or neither."""
    if not machine_size:
        return None
    src, dst = t["src"][sel], t["dst"][sel]
    if (src >= workers).any() or (dst >= workers).any():
        return None
    inside = src // machine_size == dst // machine_size
    return "inside" if inside.all() else "across" if not inside.any() else None


def _kinds(t: dict, elements: int, workers: int, machine_size) -> dict:
    """Per kind of transfer in a round: (whether every one moves the whole buffer, its level)."""
    out = {}
    for op in (REDUCE, COPY, CODED):
        sel = t["op"] == op
        if sel.any():
            whole = bool(((t["offset"][sel] == 0) & (t["count"][sel] >= elements)).all())
            out[op] = (whole, _level(t, sel, workers, machine_size))
    return out


def _phase_names(kinds: list[dict], phases: dict, machine_size, workers: int) -> dict:
    """(round, op) -> (phase name, step, steps): runs of rounds with one key per kind of transfer."""
    out = {}
    for op in (REDUCE, COPY, CODED):
        rounds = [r for r, k in enumerate(kinds) if op in k]
        runs = []
        for r in rounds:
            if runs and kinds[runs[-1][-1]][op] == kinds[r][op]:
                runs[-1].append(r)
            else:
                runs.append([r])
        # the algorithm's own name goes to its longest run, of parts of the buffer before whole ones
        main = max(runs, key=lambda run: (len(run), not kinds[run[0]][op][0])) if runs else None
        for run in runs:
            whole, level = kinds[run[0]][op]
            if (op, level) in phases:              # the algorithm's own name at this level
                name = phases[(op, level)]
            elif level is not None:
                where = " inside each machine" if machine_size < workers else " inside the machine"
                name = (_WHOLE_MAIN[op] if whole else _WHOLE[op][1]) + (where if level == "inside" else " across machines")
            elif run is main or any((op, at) in phases for at in ("inside", "across")):
                name = phases[op]               # an algorithm that names its levels names the rest too
            else:
                name = _WHOLE[op][0 if whole else 1]
            for k, r in enumerate(run):
                out[(r, op)] = (name, k + 1, len(run))
    return out


def _channels(g: rules.Group) -> list[rules.Group] | None:
    """Several rings at once (channels), told one by one: every sender sends R > 1 transfers,
    and cut by the chunks they move into R regions, each region's transfers are one cycle
    through the senders (one ring each, as NCCL runs its channels on separate parts of the buffer)."""
    senders = np.unique(g.src)
    n = len(senders)
    if len(g.src) % n or len(g.src) // n < 2 or (np.bincount(g.src)[senders] != len(g.src) // n).any():
        return None
    order = np.argsort(g.first, kind="stable")
    blocks = [order[k * n:(k + 1) * n] for k in range(len(g.src) // n)]
    for a, b in zip(blocks, blocks[1:]):
        if g.end[a].max() > g.first[b].min():
            return None
    parts = []
    for block in blocks:
        keep = np.zeros(len(g.src), bool)
        keep[block] = True
        part = g.part(keep)
        found = rings.cycles(part)
        if found is None or len(found) != 1 or len(found[0]) != n:      # not one ring through the senders
            return None
        parts.append(part)
    return parts


def _by_span(g: rules.Group) -> list[str] | None:
    """The transfers grouped by the chunks they move, each group told by a rule (a pipelined
    tree sends several segments in one round); the rest listed. None if no group of two or
    more fits a rule."""
    keys = sorted(set(zip(g.first.tolist(), g.end.tolist())))
    told, rest = [], np.zeros(len(g.src), bool)
    for a, b in keys:
        keep = (g.first == a) & (g.end == b)
        part = g.part(keep)
        text = None if keep.sum() < 2 else next(filter(None, (rule(part) for rule in (rules.gather, rules.scatter,
                                                                                      rules.tree))), None)
        if text is None:
            rest |= keep
        else:
            told.append(text)
    if not told:
        return None
    return told + ([rules.single(g.part(rest)) or rules.listing(g.part(rest))] if rest.any() else [])


def tell(g: rules.Group, lanes=None) -> list[str]:
    """The clauses that state a group of transfers (one kind, one round). ``lanes``: (each
    transfer's lane, {lane: its label}) where the schedule names its lanes, one clause each."""
    if lanes is not None:
        lane, label = lanes
        out = []
        for k in np.unique(lane):
            part = g.part(lane == k)
            text = next(filter(None, (rule(part) for rule in RULES)), None) or rules.listing(part)
            out.append(f"{label[int(k)]}: {text}")
        return out
    for rule in RULES:
        text = rule(g)
        if text:
            return [text]
    parts = _channels(g)
    if parts:
        out = []
        for k, part in enumerate(parts):
            text = next(filter(None, (rule(part) for rule in RULES)), None) or rules.listing(part)
            out.append(f"ring {k + 1} of {len(parts)}: {text}")
        return out
    return _by_span(g) or [rules.listing(g)]


def _detail(t: dict, first, end, chunks: int, names) -> str:
    order = np.lexsort((first, t["dst"], t["src"]))
    items = [f"{names[t['src'][i]]} -> {names[t['dst'][i]]}: " +
             ("coded packet" if t["op"][i] == CODED else rules.span(int(first[i]), int(end[i]), chunks))
             for i in order[:MAX_DETAIL]]
    more = f", and {len(order) - MAX_DETAIL} more" if len(order) > MAX_DETAIL else ""
    return "; ".join(items) + more


def _sentence(t: dict, r: int, cuts, names, steps: dict, workers: int, machine_size, detail: bool,
              lane_labels: dict | None = None) -> dict:
    chunks = len(cuts) - 1
    first, end = chunk_of(cuts, t["offset"], t["count"])
    coded = t["op"] == CODED
    first, end = np.where(coded, 0, first), np.where(coded, chunks, end)     # a coded packet mixes every chunk
    heads, clauses = [], []
    channel = t.get("channel")
    for op in (REDUCE, COPY, CODED):
        sel = t["op"] == op
        if not sel.any():
            continue
        name, k, total = steps[(r, op)]
        heads.append((name, f"{name}, step {k} of {total}"))
        for c in (np.unique(channel[sel]) if channel is not None else [None]):
            keep = sel if c is None else sel & (channel == c)
            g = rules.Group(op, t["src"][keep], t["dst"][keep], first[keep], end[keep], workers, chunks, names,
                            machine_size)
            lanes = None if lane_labels is None or "lane" not in t else (t["lane"][keep], lane_labels[op])
            said = tell(g, lanes)
            clauses += said if c is None else [f"on channel {c}: {x}" for x in said]
    out = {"round": r, "phase": " + ".join(h[0] for h in heads),
           "text": " and ".join(h[1] for h in heads) + ": " + "; ".join(clauses) + "."}
    if detail:
        out["transfers"] = _detail(t, first, end, chunks, names)
    return out


def _lane_labels(schedule, lane_name: str | None) -> dict | None:
    """Per kind of transfer, {lane: "tree k of K"}: its lanes counted in order, where the
    algorithm names its lanes and the schedule has several."""
    if not lane_name or schedule.lane is None or len(np.unique(schedule.lane)) < 2:
        return None
    out = {}
    for op in (REDUCE, COPY, CODED):
        present = np.unique(schedule.lane[schedule.transfers["op"] == op]).tolist()
        out[op] = {k: f"{lane_name} {i + 1} of {len(present)}" for i, k in enumerate(present)}
    return out


def narrate(schedule: Schedule, cuts, names=None, phases=None, machine_size=None, rounds=None,
            detail: bool = True, lane_name: str | None = None) -> list[dict]:
    """One entry per round: its phase, its step within that phase, and the sentence saying
    who sends which chunk to whom. ``cuts`` are the chunk boundaries (element offsets);
    ``names`` name the schedule's nodes (default "worker i", and the helpers' own names);
    ``phases`` map REDUCE, COPY and CODED to phase names (default reduce, gather, coded
    exchange), and (op, "inside" | "across") to the names of the runs at that level;
    ``lane_name``: what the algorithm calls one of its lanes ("ring", "tree"), its clauses
    then told lane by lane; ``machine_size``: workers per machine (consecutive ranks), for algorithms that
    work inside and across machines, whose phases are then named by level; ``rounds``: the
    rounds to tell (default all); ``detail``: each entry's "transfers", the round's transfers
    listed one by one (up to MAX_DETAIL).

    >>> from gradsync.algorithms import ring
    >>> s = ring.schedule(4, 8)
    >>> narrate(s, [0, 2, 4, 6, 8])[1]["text"]
    'reduce, step 2 of 3: every worker i sends chunk i - 1 to worker i + 1 (mod 4), which adds it to its own.'
    """
    cuts = np.asarray(cuts, dtype=np.int64)
    phases = {**_DEFAULT_PHASES, **(phases or {})}
    workers = schedule.workers
    names = list(names) if names is not None else [f"worker {i}" for i in range(workers)] + list(schedule.helpers)
    source = _Rounds(schedule)
    kinds = [source.kinds(r, machine_size) for r in range(schedule.rounds)]
    steps = _phase_names(kinds, phases, machine_size, workers)
    labels = None if source.compact else _lane_labels(schedule, lane_name)
    wanted = range(schedule.rounds) if rounds is None else rounds
    return [_sentence(source.get(r), r, cuts, names, steps, workers, machine_size, detail, labels)
            for r in wanted if kinds[r]]
