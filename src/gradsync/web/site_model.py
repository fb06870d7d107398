"""The model the static export carries, as data: schedules and topologies, so the page can
time any size, bandwidth, latency and failure itself (``static/model.js``) without a server.

A schedule's structure (who sends to whom in which round, and which pieces of the buffer)
does not depend on the buffer's size; only the pieces' sizes do, and every algorithm cuts its
buffer with ``chunk_bounds`` (split into Q near-equal parts, possibly inside K weighted parts
first: a ring per NVLink ring) or into c components of ceil(d / c) elements (coded schedules).
So each transfer is exported once per (algorithm, options, workers) with its ends as *cut
labels* -- (k, Q, i): the i-th of Q parts inside the k-th weighted part -- or, for coded
schedules, as multiples of ceil(d / c). A label is fitted at one size and then checked
against schedules built at several other sizes; a schedule it does not reproduce exactly is
not exported (``Unfit``), never approximated.

>>> from gradsync import algorithms
>>> s = schedule_data(lambda d: algorithms.build("ring", 4, d))
>>> s["mode"], s["labels"][:3]
('cuts', [[0, 1, 0], [0, 4, 1], [0, 2, 1]])
"""

from __future__ import annotations

import re

import numpy as np

from ..core.schedule import chunk_bounds, carried_inputs

REF = 1_000_000_007            # elements: a prime, so distinct fractions i / Q give distinct cuts
CHECKED = (1000, 4099, 65_537, 4_000_003, 123_456_789)   # sizes (elements) each label is checked at
MAX_PARTS = 256


class Unfit(Exception):
    """A schedule whose pieces are not cut labels (or multiples of ceil(d / c)) at every size."""


def _split(d: int, weights) -> np.ndarray:
    return chunk_bounds(d, len(weights), weights)


def _label_values(d: int, labels, weights) -> np.ndarray:
    """Each label (k, Q, i)'s offset at ``d`` elements, as ``chunk_bounds`` computes it."""
    outer = _split(d, weights)
    out = np.empty(len(labels), np.int64)
    for j, (k, q, i) in enumerate(labels):
        lo, hi = int(outer[k]), int(outer[k + 1])
        out[j] = lo + int(np.floor(float(i / q) * (hi - lo) + 1e-9))
    return out


def _fit_labels(values: np.ndarray, weights, total: int = REF) -> list:
    """The label of each cut value at ``total`` elements (the fewest parts that give it)."""
    outer = _split(total, weights)
    labels = []
    for v in values.tolist():
        k = min(int(np.searchsorted(outer, v, side="right")) - 1, len(weights) - 1)
        lo, hi = int(outer[k]), int(outer[k + 1])
        found = None
        for q in range(1, MAX_PARTS + 1):
            i = round((v - lo) * q / max(hi - lo, 1))
            if 0 <= i <= q and lo + int(np.floor(float(i / q) * (hi - lo) + 1e-9)) == v:
                found = [k, q, i]
                break
        if found is None:
            raise Unfit(f"cut {v} of {total} is not i / Q of a part for Q <= {MAX_PARTS}")
        labels.append(found)
    return labels


def _outer_splits(ref) -> list:
    """The first splits a schedule may make before cutting its parts again: its rings'
    weights, its machines' equal parts (a hierarchical schedule's rails), its lanes or its
    segments, or none."""
    out = [ref.options.get("weights") or [1.0]]
    if ref.options.get("local_size"):
        out.append([1.0] * int(ref.options["local_size"]))
    if ref.lane is not None and len(ref.lane):          # NCCL's lanes (channels), each an equal part,
        lanes = int(ref.lane.max()) + 1                  # or each part two lanes (a tree's up and down)
        out += [[1.0] * k for k in sorted({lanes, lanes // 2} - {0})]
    if ref.options.get("segments"):                      # a pipeline's segments, cut again inside
        out.append([1.0] * int(ref.options["segments"]))
    return out


def _rows(t) -> np.ndarray:
    return np.stack([t["src"], t["dst"], t["round"], t["op"]]).astype(np.int64)


def _cut_form(ref, weights) -> dict:
    t = ref.transfers
    if len(ref.compute):
        raise Unfit("local compute with cut labels")
    values = np.unique(np.concatenate([[0, ref.elements], t["offset"], t["offset"] + t["count"]]))
    labels = _fit_labels(values, weights, ref.elements)
    return {"mode": "cuts", "labels": labels, "weights": list(map(float, weights)),
            "a": np.searchsorted(values, t["offset"]).tolist(),
            "b": np.searchsorted(values, t["offset"] + t["count"]).tolist()}


def _ceil_form(ref) -> dict:
    t, c = ref.transfers, ref.compute
    parts = int(ref.options.get("components") or 0)
    m = -(-ref.elements // parts) if parts else 0
    if not m or (t["count"] % m).any() or (t["offset"] % m).any() or (c["madds"] % m).any():
        raise Unfit("pieces are not multiples of ceil(d / c)")
    return {"mode": "ceil", "components": parts, "a": (t["offset"] // m).tolist(), "q": (t["count"] // m).tolist(),
            "compute": {"node": c["node"].tolist(), "round": c["round"].tolist(),
                        "k": (c["madds"] // m).tolist()}}


def counts_at(form: dict, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each exported transfer's offset and count at ``d`` elements, and the compute's
    multiply-adds (the same arithmetic as ``static/model.js``)."""
    if form["mode"] == "cuts":
        v = _label_values(d, form["labels"], form["weights"])
        a, b = v[form["a"]], v[form["b"]]
        return a, b - a, None
    m = -(-d // form["components"])
    return np.asarray(form["a"]) * m, np.asarray(form["q"]) * m, np.asarray(form["compute"]["k"]) * m


def _check(form: dict, rows: np.ndarray, build, checked=CHECKED) -> None:
    for d in checked:
        s = build(d)
        offset, count, madds = counts_at(form, d)
        kept = count > 0
        t = s.transfers
        if (len(t) != kept.sum() or (_rows(t) != rows[:, kept]).any() or (t["offset"] != offset[kept]).any()
                or (t["count"] != count[kept]).any()):
            raise Unfit(f"the labels do not reproduce the schedule at {d} elements")
        if form.get("lane") is not None and (s.lane is None or (s.lane != np.asarray(form["lane"])[kept]).any()):
            raise Unfit(f"the lanes are not the same at {d} elements")
        if madds is not None and (len(s.compute) != len(madds) or (s.compute["madds"] != madds).any()):
            raise Unfit(f"the compute does not scale as ceil(d / c) at {d} elements")


PACKED = ("src", "dst", "round", "op", "a", "b", "q", "carried", "channel", "lane")


def pack(values: list) -> list | dict:
    """An integer column as the shorter of itself and its runs of equal steps: ``{"runs": [first,
    step, count, step, count, ...]}`` (schedules repeat a pattern per worker and per round, so
    a column of thousands is a few dozen numbers); ``static/site.js`` unpacks it.

    >>> pack([0, 1, 2, 3, 0, 1, 2, 3])
    {'runs': [0, 1, 3, -3, 1, 1, 3]}
    """
    if len(values) < 3:
        return list(values)
    steps = np.diff(np.asarray(values, np.int64))
    change = np.flatnonzero(np.diff(steps)) + 1
    starts = np.concatenate([[0], change])
    counts = np.diff(np.concatenate([starts, [len(steps)]]))
    runs = [int(values[0])] + np.column_stack([steps[starts], counts]).ravel().tolist()
    return {"runs": runs} if len(runs) < len(values) else list(values)


def unpack(column) -> list:
    """``pack``'s inverse: ``unpack(pack(x)) == x``."""
    if isinstance(column, list):
        return column
    runs = column["runs"]
    out = [runs[0]]
    for step, count in zip(runs[1::2], runs[2::2]):
        base = out[-1]
        out.extend(base + step * (k + 1) for k in range(count))
    return out


def packed(data: dict) -> dict:
    """A family's integer columns packed (``pack``), its compute's too."""
    out = {k: pack(v) if k in PACKED and isinstance(v, list) else v for k, v in data.items()}
    if isinstance(data.get("compute"), dict):
        out["compute"] = {k: pack(v) for k, v in data["compute"].items()}
    return out


NUMBER = re.compile(r"\d+")


def told_in_forms(families: dict) -> list[str]:
    """Every family's sentences written as shared forms and their numbers, in place: each entry
    becomes [round, phase form, text form, numbers...], a form being a sentence with its numbers
    taken out ("#"); return the forms. The page puts the numbers back (site.js ``unpacked``).
    A pipeline repeats a few forms with new numbers each round (NCCL's tree: 14.3 MB of
    sentences become 2.1 MB).

    >>> f = {"narration": [{"round": 3, "phase": "reduce", "text": "worker 1 sends chunk 12 to worker 2."}]}
    >>> told_in_forms({"k": f}), f["narration"]
    (['reduce', 'worker # sends chunk # to worker #.'], [[3, 0, 1, 1, 12, 2]])
    """
    forms: dict[str, int] = {}
    for family in families.values():
        if not family or not family.get("narration"):
            continue
        rows = []
        for entry in family["narration"]:
            row = [entry["round"]]
            numbers = []
            for text in (entry["phase"], entry["text"]):
                if "#" in text:
                    raise ValueError(f"a sentence with '#' cannot be written as a form: {text!r}")
                row.append(forms.setdefault(NUMBER.sub("#", text), len(forms)))
                numbers += [int(x) for x in NUMBER.findall(text)]
            rows.append(row + numbers)
        family["narration"] = rows
    return list(forms)


def _lanes(ref) -> list | None:
    """Each transfer's lane where the schedule runs several (NCCL's channels: the simulator
    keeps each lane's steps in their own order), else None."""
    if ref.lane is None or not len(ref.lane) or (ref.lane == ref.lane[0]).all():
        return None
    return ref.lane.tolist()


def schedule_data(build, ref_elements: int = REF, checked=CHECKED) -> dict:
    """One schedule family as data: ``build(d)`` gives the schedule for ``d`` elements.
    Its transfers (src, dst, round, op), their pieces as cut labels or multiples of
    ceil(d / c), and how many inputs each carries; checked at every size of ``CHECKED``."""
    ref = build(ref_elements)
    rows = _rows(ref.transfers)
    form = None
    lane = _lanes(ref)
    for outer in _outer_splits(ref):
        try:
            form = {**(_cut_form(ref, outer) if ref.codec is None else _ceil_form(ref)), "lane": lane}
            _check(form, rows, build, checked)
            break
        except Unfit:
            form = None
    if form is None:
        form = {**_ceil_form(ref), "lane": lane}
        _check(form, rows, build, checked)
    src, dst, rnd, op = rows.tolist()
    return {**form, "src": src, "dst": dst, "round": rnd, "op": op, "rounds": ref.rounds,
            "nodes": ref.nodes, "workers": ref.workers, "helpers": list(ref.helpers),
            "carried": carried_inputs(ref).tolist(), "name": ref.algorithm,
            "options": {k: v for k, v in ref.options.items() if k in ("segments", "components", "eps", "local_size",
                                                                   "inter")}}
