"""Plans and the collective, every rank a thread of this process (the in-memory transport
delivers matched messages in random order, some time after posting), against numpy sums."""


import threading
import time

import numpy as np
import pytest
import torch

from gradsync import algorithms
from gradsync.algorithms import central, halving_doubling, ring
from gradsync.errors import MismatchError
from gradsync.core import plan as plan_module
from gradsync.core.plan import compile_plan
from gradsync.runtime.compile import compiled, frozen
from gradsync.runtime.prepare import prepare
from gradsync.runtime.transport import MemoryTransport
from thread_groups import run_group


@pytest.fixture(params=[None, 64 << 10], ids=["default-pieces", "64KB-pieces"])
def piece_bytes(request, monkeypatch):
    """Run with the default piece size, and with small pieces (many per transfer)."""
    if request.param is not None:
        monkeypatch.setattr(plan_module, "PIECE_BYTES", request.param)
    compiled.cache_clear()
    yield
    compiled.cache_clear()


@pytest.mark.parametrize("algorithm", algorithms.names(exact=True))
@pytest.mark.parametrize("workers", [2, 3, 5])
@pytest.mark.parametrize("elements", [0, 1, 7, 600_001])
def test_every_exact_plan_sums_exactly_with_messages_in_any_order(algorithm, workers, elements, piece_bytes):
    rng = np.random.default_rng(workers * 1000 + elements)
    inputs = [torch.tensor(rng.integers(-1000, 1000, elements), dtype=torch.float64) for _ in range(workers)]
    expected = np.sum([x.numpy() for x in inputs], axis=0)
    for seed in (0, 1):
        for r, got in enumerate(run_group(inputs, algorithm, seed)):
            assert isinstance(got, torch.Tensor), got
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=f"rank {r}")


def test_cerar_plan_is_within_its_design_error(piece_bytes):
    rng = np.random.default_rng(3)
    inputs = [torch.tensor(rng.standard_normal(300_001)) for _ in range(3)]
    expected = np.sum([x.numpy() for x in inputs], axis=0)
    bound = 10 * compiled("cerar", 3, 300_001, "float64", frozen({"components": 6}), 0).design.predicted_error("float64")
    assert bound < 1e-5
    for got in run_group(inputs, "cerar", components=6):
        error = np.linalg.norm(got.numpy() - expected) / np.linalg.norm(expected)
        assert error < bound, (error, bound)


def test_a_mismatch_in_the_steady_state_is_named_on_every_rank_and_nothing_is_applied():
    inputs = [torch.ones(10) for _ in range(3)]
    assert all(isinstance(g, torch.Tensor) for g in run_group(inputs, "ring"))     # first time: checked up front
    assert all(isinstance(g, torch.Tensor) for g in run_group([torch.ones(10, dtype=torch.float64)] * 3, "ring"))
    mixed = [torch.ones(10), torch.ones(10), torch.ones(10, dtype=torch.float64)]    # both seen before
    results = run_group(mixed, "ring")
    for got in results:
        assert isinstance(got, MismatchError) and "dtype" in str(got) and "[2]" in str(got), got


def test_pieces_of_a_send_wait_only_for_what_they_read():
    plan = compile_plan(ring.schedule(4, 4_000_000), rank=1, itemsize=4, piece=250_000)   # 4 pieces a chunk
    first_of_round_1 = next(s for s in plan.steps if s.round == 1)
    # piece 0 of round 1 leaves once piece 0 of round 0 is in, not the whole round
    assert first_of_round_1.applies == 1 < sum(r.round == 0 for r in plan.receives)


def test_scratch_is_bounded_by_two_rounds_for_ring_and_in_place_where_safe():
    n = 8_000_000
    plan = compile_plan(ring.schedule(8, n), rank=3, itemsize=4)
    assert plan.scratch == 2 * (n // 8)
    assert all(r.scratch == -1 for r in plan.receives if r.op == 1)         # the all-gather lands in place
    assert compile_plan(central.schedule(4, 1000), rank=0, itemsize=4).scratch == 3 * 1000   # (N - 1) x n
    assert compile_plan(central.schedule(4, 1000), rank=1, itemsize=4).scratch == 0


@pytest.mark.parametrize("algorithm", algorithms.names(exact=True))
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_no_receive_is_posted_after_this_ranks_sends_of_its_own_round(algorithm, workers):
    # Gloo sends only once the receiver announced its receive, and the announcement queues
    # behind the receiver's own data: a receive posted after a same-round send stalls the link
    for rank in range(workers):
        plan = compile_plan(algorithms.get(algorithm).schedule(workers, 4_000_000), rank=rank, itemsize=4,
                            piece=250_000)
        step_rounds = [step.round for step in plan.steps]
        for n, step in enumerate(plan.steps):
            for j in step.posts:
                assert step.round <= plan.receives[j].round, (rank, n, plan.receives[j])
        for j in plan.drain_posts:         # at the end only when every send of this rank came before
            assert max(step_rounds, default=-1) < plan.receives[j].round, (rank, plan.receives[j])


def test_each_post_hands_its_receives_to_the_transport_before_its_sends(monkeypatch):
    calls = []
    post = MemoryTransport.post

    def recording(self, ops):
        calls.append([kind for kind, *_ in ops])
        return post(self, ops)

    monkeypatch.setattr(MemoryTransport, "post", recording)
    inputs = [torch.arange(600_001, dtype=torch.float64) for _ in range(2)]
    for algorithm in ("ring", "sharded", "halving_doubling", "tree"):
        calls.clear()
        results = run_group(inputs, algorithm)
        assert all(isinstance(got, torch.Tensor) for got in results), results
        # beyond the agreement's one exchange per rank, steps that both receive and send
        assert sum("send" in kinds and "recv" in kinds for kinds in calls) > len(inputs), (algorithm, calls)
        assert all(kinds == sorted(kinds) for kinds in calls), (algorithm, calls)    # "recv" < "send"


def test_halving_doubling_on_a_non_power_of_two_is_planned_and_checked():
    for rank in range(6):
        plan = compile_plan(halving_doubling.schedule(6, 3_000_000), rank=rank, itemsize=8)
        assert plan.steps and plan.receives


def test_a_blocking_all_reduce_in_a_futures_callback_runs_instead_of_waiting_forever():
    transports = MemoryTransport.group(2)
    out = [None, None]

    def rank(r):
        first = torch.ones(10)
        second = torch.full((10,), 100.0)

        def then(future):          # runs on this rank's progress thread, on completion
            prepare(second, "ring", "sum", transports[r], time.monotonic() + 10).start(True).wait()
            return future.value()

        future = prepare(first, "ring", "sum", transports[r], time.monotonic() + 10).start()
        out[r] = (future.then(then).wait().tolist(), second.tolist())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == [([2.0] * 10, [200.0] * 10)] * 2, out


def test_a_parameter_that_requires_grad_is_all_reduced_in_place():
    transports = MemoryTransport.group(3)
    params = [torch.nn.Parameter(torch.full((7,), float(r + 1))) for r in range(3)]   # leaves, like dist's
    errors = []

    def rank(r):
        try:
            prepare(params[r], "central", "sum", transports[r], time.monotonic() + 10).start(True).wait()
        except Exception as exc:       # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors and all(p.tolist() == [6.0] * 7 for p in params), (errors, params)
