"""gradsync train: data-parallel training equals single-worker training, and its figures add up."""

import subprocess
import sys

import pytest

from gradsync.training.train import TrainConfig, train


@pytest.mark.slow   # a multi-process run of several seconds; CI runs it with -m slow
def test_two_workers_train_exactly_like_one_on_the_whole_batch():
    cfg = TrainConfig(algorithm="ring", epochs=2, batch_size=64)
    one = train(1, cfg)["history"]
    two = train(2, cfg)["history"]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1 / 359 + 1e-9)
        assert b["replica_max_diff"] == 0.0


def test_bytes_per_worker_follow_the_ring_closed_form():
    # a ring moves 2(N - 1)/N of the gradient per worker and step: at N = 2 exactly the 9,610
    # parameters (chunks of 4,805), independent of how the meter counts
    h = train(2, TrainConfig(algorithm="ring", epochs=1, batch_size=64))["history"][0]
    steps, params, workers = 1438 // 64, 9610, 2
    assert h["bytes_per_worker"] == steps * 2 * (workers - 1) * params // workers * 4
    assert h["test_accuracy"] > 0.5 and h["sync_s"] > 0 and h["compute_s"] > 0


@pytest.mark.slow
def test_cerar_reports_its_error_and_drift_and_resync_removes_the_drift():
    drift = train(4, TrainConfig(algorithm="cerar", components=8, epochs=2))["history"]
    assert all(0 < h["grad_rel_error"] < 1e-2 for h in drift)
    assert drift[-1]["replica_max_diff"] > 0
    fixed = train(4, TrainConfig(algorithm="cerar", components=8, epochs=1, resync_every=1))["history"][0]
    assert fixed["replica_max_diff"] == 0.0 and fixed["resync_s"] > 0 and fixed["resync_bytes"] > 0


@pytest.mark.slow   # a multi-process run of several seconds; CI runs it with -m slow
def test_train_cli_json_and_bad_input():
    run = subprocess.run([sys.executable, "-m", "gradsync", "train", "--workers", "2", "--epochs", "1",
                          "--format", "json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import json
    assert json.loads(run.stdout)["history"][0]["epoch"] == 1
    bad = subprocess.run([sys.executable, "-m", "gradsync", "train", "--workers", "4", "--batch-size", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "at least the number of workers" in bad.stderr and bad.stderr.count("\n") == 1
