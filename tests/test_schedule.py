"""The schedule IR: JSON round trip and a verifier that catches every kind of broken schedule."""

import json

import numpy as np
import pytest

from gradsync import Schedule, ScheduleError, schedule, verify
from gradsync.core.schedule import COPY, REDUCE, chunk_bounds, transfers


def make(workers, elements, rows, helpers=()):
    return Schedule("handmade", workers, elements, np.concatenate([transfers(*r) for r in rows]), helpers=helpers)


def test_json_round_trip_preserves_everything():
    s = schedule("tree", 7, 1001, segments=5)
    back = Schedule.from_json(s.to_json())
    assert np.array_equal(back.transfers, s.transfers)
    assert (back.workers, back.elements, back.rounds, back.options) == (7, 1001, s.rounds, {"segments": 5})
    verify(back)


def test_schedule_is_frozen():
    s = schedule("ring", 4, 10)
    with pytest.raises(ValueError):
        s.transfers["count"][0] = 3
    with pytest.raises(AttributeError):
        s.workers = 5


def test_malformed_json_is_a_schedule_error():
    good = schedule("ring", 3, 9).to_dict()
    for broken in ({}, {**good, "format": "x"}, {**good, "transfers": {**good["transfers"], "src": [0]}},
                   {**good, "workers": "many"}):
        with pytest.raises(ScheduleError):
            Schedule.from_dict(json.loads(json.dumps(broken)))


def test_chunk_bounds_cover_the_buffer_evenly():
    for n in range(0, 50):
        for parts in range(1, 9):
            b = chunk_bounds(n, parts)
            assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) >= 0)
            assert np.diff(b).max() - np.diff(b).min() <= 1


def test_verifier_accepts_a_correct_handmade_schedule():
    verify(make(2, 4, [(0, 0, 1, 0, 4, REDUCE), (1, 1, 0, 0, 4, COPY)]))


def test_verifier_catches_double_counting():
    s = make(2, 4, [(0, 0, 1, 0, 4, REDUCE), (1, 1, 0, 0, 4, REDUCE)])
    with pytest.raises(ScheduleError, match="round 1: transfer 1 -> 0 .* worker 0's input would be counted twice"):
        verify(s)


def test_verifier_catches_a_missing_contribution():
    s = make(3, 6, [(0, 0, 1, 0, 6, REDUCE), (1, 1, 0, 0, 6, COPY), (1, 1, 2, 0, 6, COPY)])
    with pytest.raises(ScheduleError, match=r"worker 0 ends without the input of worker\(s\) \[2\]"):
        verify(s)


def test_verifier_catches_read_before_arrival():
    # the host sends back in round 0, before anything reached it
    s = make(2, 4, [(0, 2, 0, 0, 4, COPY), (0, 0, 2, 0, 4, REDUCE)], helpers=("host",))
    with pytest.raises(ScheduleError, match="read before arrival"):
        verify(s)


def test_verifier_catches_bad_endpoints_and_segments():
    for row in [(0, 0, 5, 0, 4, REDUCE), (0, 0, 0, 0, 4, REDUCE), (0, 0, 1, 2, 4, REDUCE)]:
        with pytest.raises(ScheduleError, match="endpoints must be"):
            verify(make(2, 4, [row]))


def test_verifier_catches_conflicting_writes():
    s = make(3, 4, [(0, 1, 0, 0, 4, COPY), (0, 2, 0, 2, 2, COPY)])
    with pytest.raises(ScheduleError, match="writes the same elements"):
        verify(s)


@pytest.mark.parametrize("mutation", ["drop", "reduce_to_copy", "copy_to_reduce"])
@pytest.mark.parametrize("index", [0, 7, 23, 39])
def test_a_mutated_ring_fails_verification(mutation, index):
    table = schedule("ring", 5, 50).transfers.copy()
    if mutation == "drop":
        table = np.delete(table, index)
    elif mutation == "reduce_to_copy":
        index = index % 20                      # reduce-scatter rounds hold the first 20 transfers
        table["op"][index] = COPY
    else:
        index = 20 + index % 20
        table["op"][index] = REDUCE
    with pytest.raises(ScheduleError):
        verify(Schedule("ring", 5, 50, table))


def test_a_tree_is_told_as_children_sending_to_parents_and_back():
    import re

    from gradsync.core.narrate import narrate

    s = schedule("tree", 7, 70)
    told = narrate(s, np.linspace(0, 70, 8).astype(int))
    first = told[0]["text"]
    assert "to their parent in the tree" in first
    senders = sorted(int(w) for w in re.findall(r"worker (\d+)", first.split(" each send")[0]))
    assert senders == sorted(s.round(0)["src"].tolist())        # the leaves, as the table says
    assert "to their children in the tree" in told[-1]["text"]


def test_the_one_shot_exchange_is_told_in_one_sentence():
    from gradsync.core.narrate import narrate

    text = narrate(schedule("one_shot", 4, 80), [0, 20, 40, 60, 80])[0]["text"]
    assert text.endswith("every worker sends its whole buffer to every other worker, which adds what it receives "
                         "to its own.")
