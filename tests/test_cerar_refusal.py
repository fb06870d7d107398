"""No silent wrong answers from CERAR: a design too inaccurate for the dtype is refused in one
line naming N, c, its error and the largest c that is not; non-finite results are errors."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import gradsync
from gradsync import ConfigError, algorithms
from gradsync.coding import cerar
from gradsync.errors import MismatchError, NonFiniteError
from gradsync.model.tune import default_candidates
from thread_groups import run_group

REFUSAL = re.compile(r"N = (\d+) workers and c = (\d+) components predicts a relative error of (\S+) in (\w+), "
                     r"above max_error = (\S+); the largest c that meets it for N = \1 in \4 is (\d+)")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=300)


def refusal(message, workers=2, components=16, dtype="float32"):
    """The numbers a one-line refusal names, checked against the codec's own."""
    assert "\n" not in message.strip(), message
    found = REFUSAL.search(message)
    assert found, message
    n, c, error, named_dtype, bound, largest = found.groups()
    assert (int(n), int(c), named_dtype, float(bound)) == (workers, components, dtype, cerar.DEFAULT_MAX_ERROR)
    assert float(error) > cerar.DEFAULT_MAX_ERROR
    assert int(largest) == cerar.largest_components(workers, dtype)
    return float(error), int(largest)


def test_the_api_refuses_a_design_too_inaccurate_for_its_dtype():
    with pytest.raises(ConfigError) as err:
        gradsync.schedule("cerar", 2, 1000, components=16)
    error, largest = refusal(str(err.value))
    assert error == pytest.approx(cerar.best(2, 16, "float32").checked_error("float32"), rel=1e-2)
    assert largest == 10


@pytest.mark.parametrize("args", [["cerar", "-n", "2", "-c", "16"],
                                  ["compare", "-t", "ethernet", "-n", "2", "-c", "16"],
                                  ["cerar", "-n", "2", "-c", "16", "--construction", "optimized"],
                                  ["train", "--workers", "2", "--algorithm", "cerar", "--components", "16"]])
def test_the_command_line_refuses_it_in_one_line_with_exit_2(args):
    run = cli(*args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stdout == ""                              # refused before anything is printed or trained
    assert run.stderr.startswith("gradsync: error: ") and run.stderr.count("\n") == 1, run.stderr
    refusal(run.stderr)


@pytest.mark.parametrize("workers,dtype", [(2, "float32"), (3, "float32"), (4, "float32"), (8, "float32"),
                                           (3, "float64")])
def test_the_largest_acceptable_c_is_accepted_and_meets_the_tolerance(workers, dtype, rng):
    largest = cerar.largest_components(workers, dtype)
    assert largest >= workers                                     # c <= N is exact
    inputs = rng.standard_normal((workers, 50_000)).astype(dtype)
    exact = inputs.astype(np.float64).sum(axis=0)
    estimates = gradsync.emulate("cerar", inputs, components=largest)
    errors = np.linalg.norm(estimates.astype(np.float64) - exact, axis=1) / np.linalg.norm(exact)
    assert errors.max() < cerar.DEFAULT_MAX_ERROR, (largest, errors.max())
    with pytest.raises(ConfigError, match=f"c = {largest + 1} components"):
        gradsync.schedule("cerar", workers, 1000, components=largest + 1, dtype=dtype)


@pytest.mark.parametrize("workers,components,dtype", [(4, 8, "float32"), (4, 12, "float32"), (8, 24, "float64"),
                                                      (3, 7, "float32"), (5, 5, "float64"), (2, 12, "float64")])
def test_the_default_design_is_the_least_inaccurate_construction(workers, components, dtype):
    chosen = cerar.best(workers, components, dtype)
    assert gradsync.schedule("cerar", workers, 100, components=components, dtype=dtype,
                             max_error=1e9).codec == chosen.to_dict()
    others = [cerar.make(workers, components, name, dtype=dtype, max_error=None) for name in cerar.CONSTRUCTIONS]
    others += [cerar.make(workers, components, "unity", dtype=dtype, scale=s, max_error=None) for s in cerar.SCALES]
    for other in others:
        assert chosen.checked_error(dtype) <= other.checked_error(dtype), (other.construction, other.scale)
    # the error refusals are based on is the prediction, unless a measurement shows more
    assert chosen.checked_error(dtype) >= chosen.predicted_error(dtype)


def test_the_search_is_cached():          # its time is a benchmark's business, not a test's
    assert cerar.best(32, 64, "float32") is cerar.best(32, 64, "float32")


def test_max_error_is_an_option_with_a_default_and_a_rule():
    spec = algorithms.get("cerar")
    assert spec.options["max_error"].default == cerar.DEFAULT_MAX_ERROR == 1e-2
    assert gradsync.schedule("cerar", 4, 1000, components=16, max_error=0.1).options["components"] == 16
    for bad in (0, -1, "x", True):
        with pytest.raises(ConfigError, match="option max_error must be a number > 0"):
            gradsync.schedule("cerar", 4, 1000, components=8, max_error=bad)


def test_explicit_parameters_that_spoil_an_acceptable_c_say_what_the_default_gets():
    default = r"the default design for this c \(no eps, max_cond, construction or scale\) predicts 0.000\d+"
    with pytest.raises(ConfigError, match=rf"c = 8 components .*; {default}; "
                                          r"the largest c that meets it for N = 4 in float32 is 8$"):
        gradsync.schedule("cerar", 4, 1000, components=8, eps=0.3)


def test_tune_offers_only_designs_that_are_accepted():
    for workers, budget in ((4, 1e-2), (4, 0.05), (8, 1e-3), (2, 1e-2)):
        picked = [c for c in default_candidates(workers, max_error=budget) if c.algorithm == "cerar"]
        assert picked, (workers, budget)
        for c in picked:
            s = algorithms.build("cerar", workers, 1000, dtype="float32", **c.kwargs())      # not refused
            assert cerar.Design.from_dict(s.codec).checked_error("float32") <= budget
    assert any(c.kwargs().get("max_error") == 0.05 for c in default_candidates(4, max_error=0.05))


def test_the_runtime_refuses_it_before_anything_moves():        # all_reduce, the DDP hook, KVStore
    for got in run_group([torch.ones(1000) for _ in range(2)], "cerar", components=16):
        assert isinstance(got, ConfigError), got
        refusal(str(got))


def test_an_approximate_result_that_turns_non_finite_is_an_error_naming_rank_algorithm_and_options():
    big = [torch.full((600,), 1e38) for _ in range(3)]        # finite, but CERAR's packets overflow float32
    for r, got in enumerate(run_group(big, "cerar", components=6)):
        assert isinstance(got, NonFiniteError), got
        assert f"rank {r}: cerar with options" in str(got) and '"components": 6' in str(got)
    assert all(torch.isfinite(t).all() for t in run_group(big, "ring"))       # exact: 3e38 fits
    clean = [torch.ones(600) for _ in range(3)]
    assert all(isinstance(t, torch.Tensor) for t in run_group(clean, "cerar", components=6))   # now seen before
    poisoned = [t.clone() for t in clean]
    poisoned[1][7] = float("nan")                             # non-finite in: named on every rank, not blamed
    for got in run_group(poisoned, "cerar", components=6):    # on the codec
        assert isinstance(got, MismatchError) and "finite" in str(got) and "[1]" in str(got), got


def test_a_non_finite_loss_stops_training(monkeypatch):
    import torch.distributed as dist

    from gradsync.training import train as training

    build = training.models.build

    def poisoned(name, seed):
        model = build(name, seed)
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
        return model

    monkeypatch.setattr(training.models, "build", poisoned)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(NonFiniteError, match=r"^the training loss is nan at epoch 1, step 1 on rank 0 \(ring\)"):
            training.worker(0, 1, training.TrainConfig(algorithm="ring", epochs=1))
    finally:
        dist.destroy_process_group()
