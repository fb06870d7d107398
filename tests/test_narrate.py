"""Every sentence of the narration, read back by an independent parser and checked against the
transfers of the round it tells: each clause's claims (sender, receiver, chunks, what the
receiver does) must be transfers of that round, and together they must be all of them.

The parser knows the sentence forms (core/narrate_rules.py's docstring lists them), not the
rules that chose them: it expands "every worker i sends chunk i - 2 to worker i + 1 (mod 8)"
into its eight transfers and compares them with the table."""

import re
from collections import Counter

import numpy as np
import pytest

from gradsync import algorithms
from gradsync.core.narrate import chunk_of, narrate
from gradsync.core.schedule import CODED, COPY, REDUCE
from gradsync.model.topology import preset
from gradsync.web import view
from gradsync.web.options import view_options

COUNTS = tuple(range(2, 18)) + (24, 32, 64)
VERB_OPS = [("adds it to its own", REDUCE), ("add it to their own", REDUCE), ("adds what it receives to its own", REDUCE),
            ("stores it in place of its own", COPY), ("store it in place of their own", COPY),
            ("stores what it receives in place of its own", COPY), ("folds it into its next packet", CODED),
            ("folds what it receives into its next packet", CODED), ("fold it into their next packets", CODED)]


class Reader:
    """Reads sentences back into the transfers they claim, for one schedule's names and chunks."""

    def __init__(self, names, workers, chunks):
        self.names, self.workers, self.chunks = names, workers, chunks
        self.index = {n: i for i, n in enumerate(names)}
        self.name = "(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + ")"

    def who(self, text):
        if text == "every worker":
            return list(range(self.workers))
        m = re.fullmatch(f"every worker but ({self.name})", text)
        if m:
            return [i for i in range(self.workers) if i != self.index[m[1]]]
        items = re.split(r", | and ", text)
        out = []
        for item in items:
            m = re.fullmatch(f"({self.name}) to ({self.name})", item)
            out += list(range(self.index[m[1]], self.index[m[2]] + 1)) if m else [self.index[item]]
        return out

    def span(self, text):
        if text == "the whole buffer":
            return 0, self.chunks
        m = re.fullmatch(r"chunk (\d+)", text) or re.fullmatch(r"chunks (\d+)-(\d+)", text)
        return int(m[1]), int(m[2] if m.lastindex == 2 else m[1]) + 1

    @staticmethod
    def expr(text, var):
        m = re.fullmatch(rf"{var}(?: ([+-]) (\d+))?", text)
        return 0 if m[1] is None else int(m[2]) * (1 if m[1] == "+" else -1)

    def piece(self, text, var):
        """A piece as a function of the variable's value: its chunks [a, b)."""
        e = rf"({var}(?: [+-] \d+)?)"
        m = re.fullmatch(rf"chunk {e}", text)
        if m:
            k = self.expr(m[1], var)
            return lambda v, period: ((v + k) % period, (v + k) % period + 1)
        m = re.fullmatch(rf"part {e} of (\d+)", text)
        if m:
            k, parts = self.expr(m[1], var), int(m[2])
            w = self.chunks // parts
            assert w * parts == self.chunks, text
            return lambda v, period: (((v + k) % parts) * w, ((v + k) % parts + 1) * w)
        m = re.fullmatch(rf"(chunk|part) {e} \(mod (\d+)\) of chunks (\d+)-(\d+)(?: cut in (\d+))?", text)
        k, period, a, b = self.expr(m[2], var), int(m[3]), int(m[4]), int(m[5]) + 1
        w = (b - a) // period
        assert w * period == b - a and (m[1] == "chunk") == (w == 1), text
        return lambda v, _: (a + (v + k) % period * w, a + ((v + k) % period + 1) * w)

    def clause(self, text):
        """(op, exact claims as a list of (src, dst, first, end), loose checks) for one clause."""
        text = re.sub(r"^((?:ring|tree) \d+ of \d+|on channel \d+): ", "", text)
        op = next(o for verb, o in VERB_OPS if re.search(rf"(which|receiver|partner|worker j) {re.escape(verb)}(:|$)", text))
        n, N = self.name, self.workers
        for pattern, expand in self.forms():
            m = re.fullmatch(pattern.replace("NAME", n), text)
            if m:
                return (op,) + expand(m)
        raise AssertionError(f"a sentence form the reader does not know: {text!r}")

    def forms(self):
        N, W = self.workers, r"(.+?)"
        spans = r"(the whole buffer|chunk \d+|chunks \d+-\d+)"
        return [
            (rf"(NAME) sends {spans} to (NAME), which .+", lambda m: ([(self.index[m[1]], self.index[m[3]]) + self.span(m[2])], None)),
            (rf"{W} (?:sends|each send) {spans} to (NAME), which adds what it receives to its own|"
             rf"{W} (?:sends|each send) {spans} to (NAME), which stores what it receives in place of its own",
             lambda m: ([(s, self.index[m[3] or m[6]]) + self.span(m[2] or m[5]) for s in self.who(m[1] or m[4])], None)),
            (rf"(NAME) sends {spans} to {W}, which (?:add|store|fold) it .+",
             lambda m: ([(self.index[m[1]], d) + self.span(m[2]) for d in self.who(m[3])], None)),
            (r"every worker sends its whole buffer to every other worker, which .+",
             lambda m: ([(i, j, 0, self.chunks) for i in range(N) for j in range(N) if i != j], None)),
            (r"every worker sends (chunk j|part j of \d+) to worker j, for every j but its own, and worker j .+",
             lambda m: ([(i, j) + self.owner(j) for i in range(N) for j in range(N) if i != j], None)),
            (r"every worker j sends (chunk j|part j of \d+) to every other worker, which .+",
             lambda m: ([(j, i) + self.owner(j) for i in range(N) for j in range(N) if i != j], None)),
            (rf"{W} (?:sends|each send) {spans} to (?:its|their) parent in the tree \(worker i to worker \(i - 1\) // 2\), which .+",
             lambda m: ([(s, (s - 1) // 2) + self.span(m[2]) for s in self.who(m[1])], None)),
            (r"(.+?) (?:sends|each send) to (?:its|their) parent in the tree \(worker i to worker \(i - 1\) // 2\), which (?:adds|stores) it [^:]+: (.+)",
             lambda m: ([(s, (s - 1) // 2) + sp for sp, ss in self.pieces(m[2]) for s in ss], None)),
            (r"(.+?) (?:sends|each send) to (?:its|their) children in the tree \(worker i to workers 2i \+ 1 and 2i \+ 2, those that exist\), "
             r"which (?:add|store) it [^:]+: (.+)",
             lambda m: ([(s, c) + sp for sp, ss in self.pieces(m[2]) for s in ss for c in (2 * s + 1, 2 * s + 2) if c < N], None)),
            (rf"{W} (?:sends|each send) {spans} to (?:its|their) children in the tree \(worker i to workers 2i \+ 1 and "
             r"2i \+ 2, those that exist\), which .+",
             lambda m: ([(s, c) + self.span(m[2]) for s in self.who(m[1]) for c in (2 * s + 1, 2 * s + 2) if c < N], None)),
            (r"every worker i sends (.+) to worker (i(?: [+-] \d+)?) \(mod (\d+)\), which (?:adds|stores) it .+", self.shift),
            (r"around the ring (NAME(?: -> NAME)+), the worker at position p sends (.+) to the next, which .+", self.around),
            (r"inside each (?:machine|group) of (\d+) (?:consecutive )?workers, the worker at local rank l sends (.+) to local "
             r"rank (l(?: [+-] \d+)?) \(mod (\d+)\) of its (?:machine|group), which .+", self.local),
            (r"across (?:machines|groups), the worker at local rank l of (?:machine|group) m sends piece (m(?: [+-] \d+)?) of part "
             r"(l(?: [+-] \d+)?) \(the buffer in (\d+) parts of (\d+) pieces\) to local rank l of (?:machine|group) "
             r"(m(?: [+-] \d+)?) \(mod (\d+)\), which .+", self.rails),
            (r"every worker i swaps with worker i XOR (\d+): each sends (the whole buffer|\d+ chunks? \(listed below\)), "
             r"and the partner .+", self.xor),
            (r"every worker i sends its coded packet to worker i \+ 1 \(mod (\d+)\), which .+",
             lambda m: ([(i, (i + 1) % N, 0, self.chunks) for i in range(N)], None)),
            (r"(\d+) transfers: (.+?)(?:, and (\d+) more \(listed below\))?, each receiver .+", self.listing),
            (r"along the chain (.+?), the worker at position p \(from 0\) sends (.+) to the next, which .+",
             lambda m: (self.along([self.path(m[1])], m[2]), None)),
            (r"along each chain \((.+)\), the worker at position p \(from 0\) sends (.+) to the next, which .+",
             lambda m: (self.along([self.path(x) for x in m[1].split(", ")], m[2]), None)),
            (r"inside each machine of (\d+) workers, along the chain of local ranks (\d+(?: -> \d+)+), the worker at "
             r"position p \(from 0\) sends (.+) to the next, which .+", self.local_chain),
        ]

    def path(self, text):
        """"A -> B -> ... -> E" (a run of consecutive workers) or "A -> B -> C" -> worker indices."""
        nodes = [self.index[x] for x in text.split(" -> ") if x != "..."]
        if "..." not in text:
            return nodes
        step = nodes[1] - nodes[0]
        return list(range(nodes[0], nodes[-1] + step, step))

    @staticmethod
    def moved(text):
        """"chunk 22 - p" or "chunks 6 - 2p to 7 - 2p" -> the chunks [a, b) moved at position p."""
        m = re.fullmatch(r"chunk (\d+) ([+-]) p", text)
        if m:
            a, sign = int(m[1]), 1 if m[2] == "+" else -1
            return lambda p: (a + sign * p, a + sign * p + 1)
        m = re.fullmatch(r"chunks (\d+) ([+-]) (\d+)p to (\d+) ([+-]) (\d+)p", text)
        a, sign, w = int(m[1]), 1 if m[2] == "+" else -1, int(m[3])
        assert int(m[4]) == a + w - 1 and m[5] == m[2] and int(m[6]) == w, text
        return lambda p: (a + sign * w * p, a + sign * w * p + w)

    def along(self, paths, what):
        at = self.moved(what)
        return [(x, path[p + 1]) + at(p) for path in paths for p, x in enumerate(path[:-1])]

    def local_chain(self, m):
        size, ranks = int(m[1]), [int(x) for x in m[2].split(" -> ")]
        assert self.workers % size == 0
        paths = [[base + r for r in ranks] for base in range(0, self.workers, size)]
        return self.along(paths, m[3]), None

    def pieces(self, text):
        """"chunks 0-1 from A and B, chunk 2 from C to D" -> [((0, 2), [a, b]), ((2, 3), [c..d])]."""
        out = []
        for item in re.split(r", (?=(?:chunks? \d|the whole buffer))", text):
            what, senders = re.fullmatch(r"(the whole buffer|chunk \d+|chunks \d+-\d+) from (.+)", item).groups()
            out.append((self.span(what), self.who(senders)))
        return out

    def owner(self, j):
        w = self.chunks // self.workers
        return j * w, (j + 1) * w

    def shift(self, m):
        N, s = self.workers, self.expr(m[2], "i")
        assert int(m[3]) == N
        at = self.piece(m[1], "i")
        return [(i, (i + s) % N) + at(i, N) for i in range(N)], None

    def around(self, m):
        order = [self.index[x] for x in m[1].split(" -> ")]
        assert order[0] == order[-1] and sorted(order[:-1]) == list(range(self.workers))
        at, n = self.piece(m[2], "p"), len(order) - 1
        return [(x, order[k + 1]) + at(k, n) for k, x in enumerate(order[:-1])], None

    def local(self, m):
        size, s = int(m[1]), self.expr(m[3], "l")
        assert int(m[4]) == size and self.workers % size == 0
        at = self.piece(m[2], "l")
        return [(i, i - i % size + (i % size + s) % size) + at(i % size, size) for i in range(self.workers)], None

    def rails(self, m):
        o2, o1, size, machines, s = self.expr(m[1], "m"), self.expr(m[2], "l"), int(m[3]), int(m[4]), self.expr(m[5], "m")
        assert int(m[6]) == machines and size * machines == self.workers
        w = self.chunks // (size * machines)
        out = []
        for i in range(self.workers):
            a = (((i % size + o1) % size) * machines + (i // size + o2) % machines) * w
            out.append((i, (i + s * size) % self.workers, a, a + w))
        return out, None

    def xor(self, m):
        d, width = int(m[1]), self.chunks if m[2] == "the whole buffer" else int(m[2].split()[0])
        return [], ("xor", {(i, i ^ d) for i in range(self.workers)}, width)

    def listing(self, m):
        rows = []
        for item in m[2].split(", "):
            s, rest = re.fullmatch(f"({self.name}) sends (.+)", item).groups()
            what, d = re.fullmatch(f"(.+) to ({self.name})", rest).groups()
            rows.append((self.index[s], self.index[d]) + self.span(what))
        return rows, ("count", int(m[1]), int(m[3] or 0))


def rows_of(schedule, cuts, r):
    t = schedule.round(r)
    first, end = chunk_of(np.asarray(cuts), t["offset"], t["count"])
    coded = t["op"] == CODED
    first, end = np.where(coded, 0, first), np.where(coded, len(cuts) - 1, end)
    return Counter(zip(t["op"].tolist(), t["src"].tolist(), t["dst"].tolist(), first.tolist(), end.tolist()))


def check_round(reader, schedule, cuts, told):
    """Every clause's claims are transfers of the round, and together they are all of them."""
    left = rows_of(schedule, cuts, told["round"])
    head, body = told["text"].split(": ", 1)
    assert body.endswith(".")
    loose = []
    for clause in body[:-1].split("; "):
        op, claims, check = reader.clause(clause)
        for row in claims:
            key = (op,) + tuple(row)
            assert left[key] > 0, (told["text"], clause, row)
            left[key] -= 1
        if check:
            loose.append((op, check))
    listed = Counter()
    for op, check in loose:
        mine = [k for k, v in left.items() for _ in range(v) if k[0] == op]
        if check[0] == "xor":
            assert {(s, d) for _, s, d, _, _ in mine} == check[1] and len(mine) == len(check[1]), told["text"]
            assert all(b - a == check[2] for *_, a, b in mine), told["text"]
            for k in mine:
                left[k] -= 1
        else:
            listed[op] += check[2]       # the ones "listed below", summed over the round's rings
    for op, count in listed.items():
        mine = [k for k, v in left.items() for _ in range(v) if k[0] == op]
        assert len(mine) == count, told["text"]
        for k in mine:
            left[k] -= 1
    assert not +left, (told["text"], +left)


def schedules():
    """Every registered algorithm at every worker count, with the options the view gives it and
    some more (several rings, machines of several sizes, both inter-machine algorithms)."""
    for name in algorithms.names():
        for n in COUNTS:
            variants = [view_options(name, preset("ring", n), n, 160_000_000, None, None)]
            if name == "ring" and n > 2:
                variants.append({"rings": [list(range(n)), [0] + list(range(n - 1, 0, -1))], "weights": [2.0, 1.0]})
            if name == "hierarchical":
                variants += [{"local_size": d, "inter": inter} for d in (2, 4, 8) if n % d == 0 and d < n
                             for inter in ("ring", "halving_doubling")]
            if name == "tree":
                variants += [{"segments": 1}, {"segments": 5}]
            if name in ("nccl_tree", "nccl_ring"):          # several machines: chains side by side, trees across
                variants += [{"local_size": d, **({"segments": 3} if name == "nccl_tree" else {})}
                             for d in (2, 4) if n % d == 0 and d < n]
            for options in variants:
                yield name, n, {k: v for k, v in options.items() if k != "max_error"}


@pytest.mark.parametrize("name", algorithms.names())
def test_every_sentence_of_every_algorithm_is_true_of_its_round(name):
    checked = 0
    for algorithm, n, options in schedules():
        if algorithm != name:
            continue
        s = algorithms.build(algorithm, n, 1000 * n + 3, dtype="float32", **options)
        cuts = view.chunk_cuts(s)
        told = view.narration(algorithms.get(name), s, cuts)
        assert [x["round"] for x in told] == list(range(s.rounds)) or name == "cerar"
        reader = Reader([f"worker {i}" for i in range(s.workers)] + list(s.helpers), s.workers, len(cuts) - 1)
        for x in told:
            check_round(reader, s, cuts, x)
            checked += 1
        check_phases(algorithms.get(name), s, told, options.get("local_size"))
    assert checked > 0


def check_phases(spec, s, told, machine):
    """Each phase's steps count 1..K over its rounds; its level and kind are what its rounds do."""
    seen = {}
    for x in told:
        t = s.round(x["round"])
        head = x["text"].split(": ", 1)[0]
        parts = re.findall(r"(.+?), step (\d+) of (\d+)(?: and |$)", head)
        assert " and ".join(f"{a}, step {b} of {c}" for a, b, c in parts) == head, head
        for name, k, total in parts:
            seen.setdefault(name, []).append((int(k), int(total)))
            op = {"reduce": REDUCE, "copy": COPY, "coded": CODED}
            keys = [key.split(" ") for key, v in spec.phases.items() if v == name]     # "reduce inside" -> [kind, level]
            ops = {op[key[0]] for key in keys}
            level = next((key[1] for key in keys if len(key) == 2), None) or \
                ("inside" if "inside" in name else "across" if "across" in name else None)
            if level is not None:
                sel = t[np.isin(t["op"], list(ops) or ([REDUCE] if name.startswith("reduce") else [COPY]))]
                inside = sel["src"] // machine == sel["dst"] // machine
                assert (inside.all() if level == "inside" else not inside.any()), x["text"]
            elif name.startswith("whole-buffer"):
                sel = t[t["op"] == (REDUCE if "reduce" in name else COPY)]
                assert ((sel["offset"] == 0) & (sel["count"] == s.elements)).all(), x["text"]
            else:
                assert ops or name in ("reduce-scatter", "all-gather"), (name, spec.phases)
    for name, steps in seen.items():
        total = steps[0][1]
        assert steps == [(k + 1, total) for k in range(total)], (name, steps)


# ---- what a student met on the page, each a test before its fix ------------------------------------

def _told(name, n, **options):
    s = algorithms.build(name, n, 1000 * n + 3, dtype="float32", **options)
    return [x["text"] for x in view.narration(algorithms.get(name), s, view.chunk_cuts(s))]


@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_halving_doubling_with_extra_workers_tells_no_tree(n):
    told = _told("halving_doubling", n)
    assert not any("tree" in t or "children" in t for t in told)
    assert told[0].startswith("whole-buffer reduce, step 1 of 1: ") and "worker 0 sends the whole buffer to worker 1" in told[0]
    assert told[1].startswith("recursive halving, step 1 of")


def test_hierarchical_names_its_phase_and_level_one_machine_too():
    told = _told("hierarchical", 8, local_size=4)
    heads = [t.split(":")[0] for t in told]
    assert heads[:3] == [f"reduce-scatter inside each machine, step {k} of 3" for k in (1, 2, 3)]
    assert heads[3] == "reduce-scatter across machines, step 1 of 1" and heads[4] == "all-gather across machines, step 1 of 1"
    assert heads[5:] == [f"all-gather inside each machine, step {k} of 3" for k in (1, 2, 3)]
    one = _told("hierarchical", 3)
    assert one[0].startswith("reduce-scatter inside the machine, step 1 of 2") and "across" not in " ".join(one)


def test_the_p3_rings_are_told_ring_by_ring_not_counted():
    topo = preset("p3.16xlarge")
    options = view_options("ring", topo, 8, 160_000_000, None, None)
    told = _told("ring", 8, **options)
    assert all(t.count("around the ring") == 2 and "transfers:" not in t for t in told)
    assert "gpu" not in told[0] and "worker 0 -> worker 3 -> worker 2" in told[0]


def test_ring_offsets_keep_their_sign_through_a_phase():
    for n in (5, 8, 9, 16):
        told = _told("ring", n)
        offsets = [int(m[1] + m[2]) if m[1] else 0
                   for m in (re.search(r"chunk i(?: ([+-]) (\d+))?", t) for t in told)]
        assert offsets[:n - 1] == [-k for k in range(n - 1)]           # i, i - 1, ..., i - (n - 2)
        assert offsets[n - 1:] == [1 - k for k in range(n - 1)]        # i + 1, i, ..., i - (n - 3)


def test_a_compact_schedule_is_told_without_its_table():
    from gradsync.algorithms import _compact
    c = _compact.build("ring", 65_536, 10**9)
    told = narrate(c, np.linspace(0, 10**9, 65_537).astype(np.int64), rounds=[0, 65_535])
    assert told[0]["text"] == ("reduce, step 1 of 65535: every worker i sends chunk i to worker i + 1 (mod 65536), "
                               "which adds it to its own.")
    assert told[1]["text"].startswith("gather, step 1 of 65535: every worker i sends chunk i + 1")
    assert "_expanded" not in c.__dict__                                 # the table was never built


def test_nccls_tree_is_told_as_chains_and_trees_never_as_rings():
    """The page once called a tree's lanes "ring 1 of 2" and its chains a reduce-scatter."""
    told = _told("nccl_tree", 16, local_size=8, segments=4)
    text = " ".join(told)
    assert "ring" not in text and "reduce-scatter" not in text and "all-gather" not in text
    assert told[1].startswith("reduce up the chains, step 2 of ") and "tree 1 of 16: inside each machine of 8 workers, " \
        "along the chain of local ranks 7 -> 6 -> 5, the worker at position p (from 0) sends chunk 1 - p" in told[1]
    heads = {t.split(", step")[0] for t in told}
    assert {"reduce up the chains", "broadcast down the chains"} <= heads
    one = _told("nccl_tree", 8, segments=4)                   # one machine: its chains only, told as chains
    assert all("along the chain worker" in t for t in one[1:-1]) and "tree 2 of 2" in one[0]


def test_nccls_rings_are_still_told_ring_by_ring():
    told = _told("nccl_ring", 16, local_size=8)
    assert all("ring 8 of 8: " in t for t in told)
