"""How ``auto`` decides (``gradsync.runtime.choice``), with the clock replaced: the engine keeps
every size where no candidate's median beats 0.95 of its time, a candidate fast only now and
then never wins, the sizes go on while the budget allows, and a size past the measured ones is
decided by each candidate's fitted cost model, not by the nearest verdict."""

import itertools

import pytest

from gradsync.runtime import choice


class _Engine:                     # one rank: a reduction of the times is the times themselves
    name = "fake"

    def barrier(self):
        return None

    def all_reduce(self, tensor, op):
        return None


class _Comm:
    engine, size, rank = _Engine(), 2, 0

    def __init__(self, seconds):
        calls = {name: itertools.count() for name in seconds}
        self.plans = {name: _Plan(lambda size, name=name: seconds[name](size, next(calls[name]))) for name in seconds}

    def _build(self, kind, name, dtype, op, contiguous):
        return self.plans[name]

    def engine_wait(self, work, what):
        pass


class _Plan:
    """A candidate whose call takes ``seconds(size)`` of a fake clock."""

    clock = [0.0]

    def __init__(self, seconds):
        self.seconds = seconds

    def start(self, tensors, async_op):
        self.clock[0] += self.seconds(tensors[0].numel() * 4)


@pytest.fixture
def fake_clock(monkeypatch):
    monkeypatch.setattr(choice.time, "monotonic", lambda: _Plan.clock[0])
    _Plan.clock[0] = 0.0


def test_a_candidate_wins_a_size_only_where_its_median_is_under_095_of_the_engines(monkeypatch, fake_clock):
    monkeypatch.setenv(choice.ENV_BUDGET, "100")
    comm = _Comm({"engine": lambda size, i: 1e-3,
                  "ring": lambda size, i: 0.9e-3 if size >= (2 << 20) else 0.97e-3,   # wins from 2 MB
                  "one_host": lambda size, i: 2e-3})
    verdicts = choice._measure(comm, "all_reduce", ["engine", "ring", "one_host"])
    assert [verdicts.pick(s) for s in choice.SIZES] == ["engine", "engine", "engine", "ring", "ring"]


def test_a_candidate_fast_only_now_and_then_does_not_win(monkeypatch, fake_clock):
    # best call 10x faster than the engine, but most calls 2x slower: the median says engine
    monkeypatch.setenv(choice.ENV_BUDGET, "100")
    comm = _Comm({"engine": lambda size, i: 1e-3, "one_host": lambda size, i: 1e-4 if i % 3 == 0 else 2e-3})
    verdicts = choice._measure(comm, "all_gather", ["engine", "one_host"])
    assert {verdicts.pick(s) for s in choice.SIZES} == {"engine"}


def test_sizes_stop_before_one_that_would_pass_the_budget(monkeypatch, fake_clock):
    monkeypatch.setenv(choice.ENV_BUDGET, "0.3")
    slow = lambda size, i: 0.002 if size < (256 << 10) else 0.02      # noqa: E731
    verdicts = choice._measure(_Comm({"engine": slow, "ring": slow}), "all_reduce", ["engine", "ring"])
    assert 1 <= len(verdicts.sizes) < len(choice.SIZES), verdicts.sizes


@pytest.mark.parametrize("nbytes,expected", [(4 << 10, "engine"), (20 << 10, "ring"), (200 << 10, "engine")])
def test_a_call_inside_the_measured_sizes_takes_the_verdict_of_the_nearest(nbytes, expected):
    v = choice.Verdicts((4 << 10, 32 << 10, 256 << 10), {"engine": [1.0, 2.0, 3.0], "ring": [2.0, 1.0, 4.0]})
    assert v.pick(nbytes) == expected


def test_past_the_measured_sizes_the_fitted_rates_decide_not_the_nearest_verdict():
    # at 16 MB the ring's fixed cost makes it lose; its rate is twice the engine's, so from
    # about 40 MB on it wins: the nearest verdict (engine) would be wrong there
    sizes = (4 << 20, 8 << 20, 16 << 20)
    engine = [1e-3 + s / 1e9 for s in sizes]             # 1 ms + 1 GB/s
    ring = [20e-3 + s / 2e9 for s in sizes]              # 20 ms + 2 GB/s
    v = choice.Verdicts(sizes, {"engine": engine, "ring": ring})
    assert v.pick(16 << 20) == "engine"
    assert v.pick(32 << 20) == "engine"                   # 33.6 ms against 36.8 ms
    assert v.pick(256 << 20) == "ring"                    # 269 ms against 154 ms


def _link(fixed, crossings, rate):
    """A candidate across machines: ``fixed`` seconds, then ``crossings`` x the bytes at ``rate``."""
    return lambda size, i: fixed + crossings * size / rate


@pytest.mark.parametrize("rate", [12.5e6, 125e6, 1.25e9])     # 100 Mbit/s, 1 and 10 Gbit/s
def test_across_machines_the_link_decides_every_size_past_the_small_one_within_the_budget(monkeypatch, fake_clock,
                                                                                          rate):
    # Gloo's flat ring carries 1.5 S over each machine's link, hierarchical 1 S after a
    # larger fixed cost: it wins from (6 - 1) ms x rate / 0.5 bytes on
    monkeypatch.setenv(choice.ENV_BUDGET, "2")
    comm = _Comm({"engine": _link(1e-3, 1.5, rate), "hierarchical": _link(6e-3, 1.0, rate),
                  "ring": _link(4e-3, 1.5, rate)})
    verdicts = choice._measure_across(comm, "all_reduce", ["engine", "hierarchical", "ring"])
    assert _Plan.clock[0] <= 2.0                                     # the first decision within its budget
    assert verdicts.sizes[0] == choice.SMALL and verdicts.sizes[1] in choice.LARGE
    crossover = 5e-3 * rate / 0.5
    for size in (64 << 10, 1 << 20, 4 << 20, 25 << 20, 256 << 20):
        best = "hierarchical" if 1e-3 + 1.5 * size / rate > 6e-3 + size / rate and size > 1.1 * crossover \
            else "engine"
        if 0.9 * crossover < size < 1.5 * crossover:
            continue                                                 # the 0.95 margin's own band
        assert verdicts.pick(size) == best, (size, verdicts.pick(size), verdicts.times)


def test_across_machines_a_candidate_that_is_never_faster_leaves_every_size_to_the_engine(monkeypatch, fake_clock):
    # at 10 Gbit/s the schedules' own costs per byte (the host's cores) exceed the link's
    monkeypatch.setenv(choice.ENV_BUDGET, "2")
    comm = _Comm({"engine": _link(1e-3, 1.5, 1.25e9), "hierarchical": _link(3e-3, 1.0, 0.6e9)})
    verdicts = choice._measure_across(comm, "all_reduce", ["engine", "hierarchical"])
    assert {verdicts.pick(s) for s in (4 << 10, 1 << 20, 25 << 20, 1 << 30)} == {"engine"}


@pytest.mark.parametrize("machines,local", [(2, 2), (2, 4), (4, 2), (3, 3), (4, 1)])
def test_bytes_over_each_machine_link_read_off_the_schedules_match_their_closed_forms(machines, local):
    hosts = tuple(r // local for r in range(machines * local))
    n = machines * local
    # a flat ring crosses each machine's boundary with 2 (N - 1)/N of the buffer (one rank per
    # machine: every link is a crossing), hierarchical with 2 (M - 1)/M
    assert choice.link_bytes("ring", hosts) == pytest.approx(2 * (n - 1) / n)
    if local > 1:
        assert choice.link_bytes("hierarchical", hosts, local) == pytest.approx(2 * (machines - 1) / machines)
