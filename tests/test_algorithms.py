"""Every exact algorithm equals numpy's float64 sum, for every shape the spec lists."""

import numpy as np
import pytest

from support import PRIMES, random_inputs
from gradsync import ConfigError, emulate, schedule, verify
from gradsync.algorithms import EXACT, REGISTRY

DTYPES = ("float32", "float64", "int32", "int64")
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def lengths_for(workers):
    return sorted({0, 1, *PRIMES, max(workers - 1, 0), workers + 1, 1000})


def check_equal(result, inputs, dtype):
    reference = inputs.astype(np.float64).sum(axis=0)
    assert result.dtype == np.dtype(dtype)
    if np.dtype(dtype).kind == "f":
        scale = np.abs(inputs.astype(np.float64)).sum(axis=0) + 1e-300
        assert np.all(np.abs(result - reference) <= TOLERANCE[dtype] * scale)
    else:
        assert np.array_equal(result, reference.astype(dtype))


@pytest.mark.parametrize("algorithm", EXACT)
@pytest.mark.parametrize("workers", range(1, 34))
def test_exact_sum_every_worker(algorithm, workers, rng):
    for length in lengths_for(workers):
        verify(schedule(algorithm, workers, length))
        for dtype in DTYPES:
            inputs = random_inputs(rng, workers, length, dtype)
            result = emulate(algorithm, inputs)
            assert result.shape == (workers, length)
            for w in range(workers):
                check_equal(result[w], inputs, dtype)


@pytest.mark.parametrize("algorithm", EXACT)
@pytest.mark.parametrize("workers", [1, 2, 5, 8, 13])
def test_average(algorithm, workers, rng):
    inputs = random_inputs(rng, workers, 97, "float64")
    result = emulate(algorithm, inputs, op="avg")
    np.testing.assert_allclose(result, np.broadcast_to(inputs.mean(axis=0), result.shape), rtol=1e-12, atol=1e-15)


def test_average_of_integers_is_refused():
    with pytest.raises(ConfigError, match="avg"):
        emulate("ring", np.ones((3, 4), dtype=np.int32), op="avg")


def test_multidimensional_inputs_keep_their_shape(rng):
    inputs = rng.standard_normal((5, 3, 7))
    result = emulate("halving_doubling", inputs)
    assert result.shape == (5, 3, 7)
    np.testing.assert_allclose(result[2], inputs.sum(axis=0), rtol=1e-12)


def test_mismatched_inputs_name_the_worker():
    with pytest.raises(ConfigError, match="worker 2"):
        emulate("ring", [np.ones(4), np.ones(4), np.ones(5)])
    with pytest.raises(ConfigError, match="dtype"):
        emulate("ring", [np.ones(4), np.ones(4, dtype=np.float32)])


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="unknown algorithm 'rign'"):
        schedule("rign", 4, 10)
    with pytest.raises(ConfigError, match="workers must be"):
        schedule("ring", 0, 10)
    with pytest.raises(ConfigError, match="elements must be"):
        schedule("tree", 3, -1)
    with pytest.raises(ConfigError, match="permutation"):
        schedule("ring", 3, 10, rings=[[0, 1, 1]])
    with pytest.raises(ConfigError, match="root"):
        schedule("central", 3, 10, root=3)
    with pytest.raises(ConfigError, match="segments"):
        schedule("tree", 3, 10, segments=0)
    with pytest.raises(ConfigError, match="bad option"):
        schedule("sharded", 3, 10, colour="red")


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_multi_ring_sum_and_traffic(workers, rng):
    rings = [list(range(workers)), list(reversed(range(workers)))]
    s = schedule("ring", workers, 1200, rings=rings, weights=[2, 1])
    verify(s)
    inputs = random_inputs(rng, workers, 1200, "float64")
    np.testing.assert_allclose(emulate(s, inputs)[0], inputs.sum(axis=0), rtol=1e-12)
    # each worker sends 2 (N - 1) / N of the buffer in total, split between the rings
    assert np.allclose(s.elements_sent(), 2 * (workers - 1) / workers * 1200, rtol=0.02)


@pytest.mark.parametrize("workers", [2, 4, 7, 16])
def test_traffic_matches_the_closed_forms(workers):
    n = 16 * 9 * 5 * 7   # divisible by every chunk count used here
    sent = {a: schedule(a, workers, n).elements_sent() for a in REGISTRY}
    assert sent["ring"][:workers].tolist() == [2 * (workers - 1) * n // workers] * workers
    assert sent["sharded"].tolist() == [2 * (workers - 1) * n // workers] * workers
    assert sent["central"][0] == (workers - 1) * n and sent["central"][1:].tolist() == [n] * (workers - 1)
    assert sent["host"].tolist() == [n] * workers + [workers * n]


def test_rounds_follow_the_formulas():
    for n in range(1, 20):
        assert schedule("ring", n, 1000).rounds == 2 * (n - 1)
        p = 1 << (n.bit_length() - 1)
        assert schedule("halving_doubling", n, 1000).rounds == 2 * (p.bit_length() - 1) + 2 * (n > p)
        height = int(np.floor(np.log2(n)))
        assert schedule("tree", n, 1000, segments=4).rounds == (4 + 2 * height - 1 if n > 1 else 0)
