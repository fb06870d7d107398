"""How the backend's ``auto`` decides, with the clock replaced: the engine keeps every size where
no schedule's median beats 0.95 of its time, a schedule fast only now and then never wins, and
the sizes go on while the budget allows."""

import itertools

import pytest

from gradsync.distributed import auto


class _Done:
    def wait(self):
        return True


class _Engine:                     # one rank: a reduction of the times is the times themselves
    def allreduce(self, tensors, opts):
        return _Done()


class _Group:
    engines = {"cpu": _Engine()}

    def size(self):
        return 2


def _trial(seconds):
    """A trial whose ``name`` takes ``seconds[name](size, call)`` (call counts per name from 0)."""
    calls = {name: itertools.count() for name in seconds}
    return lambda name, kind, size: seconds[name](size, next(calls[name]))


def test_a_schedule_wins_a_size_only_where_its_median_is_under_095_of_the_engines(monkeypatch):
    monkeypatch.setenv(auto.ENV_BUDGET, "100")
    trial = _trial({"engine": lambda size, i: 1e-3,
                    "ring": lambda size, i: 0.9e-3 if size >= (2 << 20) else 0.97e-3,   # wins from 2 MB
                    "one_host": lambda size, i: 2e-3})
    verdicts = auto._measure(_Group(), "all_reduce", ["engine", "ring", "one_host"], trial)
    assert verdicts == ["engine", "engine", "engine", "ring", "ring"]


def test_a_candidate_fast_only_now_and_then_does_not_win(monkeypatch):
    # best call 10x faster than the engine, but most calls 2x slower: the median says engine
    monkeypatch.setenv(auto.ENV_BUDGET, "100")
    trial = _trial({"engine": lambda size, i: 1e-3,
                    "one_host": lambda size, i: 1e-4 if i % 3 == 0 else 2e-3})
    assert set(auto._measure(_Group(), "all_gather", ["engine", "one_host"], trial)) == {"engine"}


def test_sizes_stop_before_one_that_would_pass_the_budget(monkeypatch):
    # the clock is real here: a trial that sleeps, and a budget that fits the small sizes only
    import time

    monkeypatch.setenv(auto.ENV_BUDGET, "0.3")

    def slow(size, i):
        time.sleep(0.002 if size < (256 << 10) else 0.02)
        return 1.0

    verdicts = auto._measure(_Group(), "all_reduce", ["engine", "ring"], _trial({"engine": slow, "ring": slow}))
    assert 1 <= len(verdicts) < len(auto.SIZES), verdicts
    assert auto.bucket(1 << 30, len(verdicts)) == len(verdicts) - 1   # larger calls take the last verdict


@pytest.mark.parametrize("nbytes,expected", [(4 << 10, 0), (20 << 10, 1), (16 << 20, 4), (1 << 30, 4)])
def test_a_call_takes_the_verdict_of_the_nearest_size(nbytes, expected):
    assert auto.bucket(nbytes, len(auto.SIZES)) == expected
