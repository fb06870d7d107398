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
