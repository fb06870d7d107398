"""verify on a compact schedule reads its program and group (core.compact_check) and agrees
with the check of the expanded table: on every builder's schedules, and on broken ones."""

import dataclasses

import numpy as np
import pytest

from gradsync.algorithms import halving_doubling, hierarchical, host, nccl_ring, pat, ring, sharded
from gradsync.core import compact_check
from gradsync.core.schedule import verify
from gradsync.errors import ScheduleError


def builders(n, e):
    yield from (ring.compact(n, e), sharded.compact(n, e), host.compact(n, e), pat.compact(n, e),
                halving_doubling.compact(n, e))
    for local in (2, 4):
        if n % local == 0:
            yield hierarchical.compact(n, e, local_size=local)
            yield hierarchical.compact(n, e, local_size=local, inter="halving_doubling")
            yield nccl_ring.compact(n, e, local_size=local)


def table_verdict(c):
    try:
        verify(c.expand())
    except ScheduleError:
        return False
    return True


def compact_verdict(c):
    try:
        compact_check.verify(c)
    except ScheduleError:
        return False
    return True


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 12])
@pytest.mark.parametrize("e", [3, 100, 1001])
def test_every_builder_is_read_without_its_table(n, e):
    for c in builders(n, e):
        if c is not None:
            assert compact_check._readable(c), (c.algorithm, n, e)
            compact_check.verify(c)


def _broken(c, rng, kind):
    prog, dig = c.program.copy(), c.digits.copy()
    i = rng.integers(len(prog))
    if kind == 0:                                   # a transfer missing
        prog, dig = np.delete(prog, i), np.delete(dig, i, axis=0)
    elif kind == 1:                                 # one sent twice
        prog, dig = np.insert(prog, i, prog[i]), np.insert(dig, i, dig[i], axis=0)
    elif kind == 2:                                 # reduce and copy swapped
        prog["op"][i] = 1 - prog["op"][i]
    elif kind == 3 and dig.shape[1]:                # another chunk
        k = rng.integers(dig.shape[1])
        dig[i, k] = (dig[i, k] + 1) % c.levels[k][1] if dig[i, k] >= 0 else dig[i, k]
    else:                                           # a round early or late
        prog["round"][i] = max(0, prog["round"][i] + rng.choice([-1, 1]))
        order = np.argsort(prog["round"], kind="stable")
        prog, dig = prog[order], dig[order]
    return dataclasses.replace(c, program=prog, digits=dig)


def test_broken_schedules_fail_as_their_tables_do():
    rng = np.random.default_rng(7)
    caught = 0
    for c in (ring.compact(6, 100), sharded.compact(5, 37), host.compact(4, 9), pat.compact(7, 50),
              halving_doubling.compact(8, 64), hierarchical.compact(8, 100, local_size=4),
              nccl_ring.compact(16, 1000, local_size=8)):
        for trial in range(25):
            broken = _broken(c, rng, trial % 5)
            assert compact_verdict(broken) == table_verdict(broken), (c.algorithm, trial)
            caught += not table_verdict(broken)
    assert caught > 100


def test_a_digit_after_a_whole_level_is_checked_on_the_table():
    c = hierarchical.compact(8, 100, local_size=4)
    dig = c.digits.copy()
    dig[:, 0] = -1                                  # every transfer: the whole buffer's chunk of level 1
    odd = dataclasses.replace(c, digits=dig)
    if (dig >= 0).any():
        assert not compact_check._readable(odd)
    assert compact_verdict(odd) == table_verdict(odd)


def test_a_ring_of_65536_workers_is_verified_without_its_table():
    c = ring.compact(65536, 10**9)
    verify(c)
    assert "_expanded" not in c.__dict__           # the 8.6e9-transfer table was never built
