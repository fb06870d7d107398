"""Elastic training on torchrun's agents: a killed worker costs time, never an update or a replica."""


import pytest
import torch

import runtime_bodies as bodies
from gradsync.errors import ConfigError
from gradsync.tools.launch import run
from gradsync.training import elastic
from gradsync.training.train import TrainConfig

CFG = TrainConfig(model="mlp", epochs=20, batch_size=32, timeout=10.0)
STEPS = CFG.epochs * (1438 // 32)


def _parameters(workdir):
    state = torch.load(workdir / elastic.CHECKPOINT, weights_only=True)
    return torch.cat([t.flatten() for t in state["model"].values()])


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_training_ends_where_the_fault_free_run_does(tmp_path):
    clean = elastic.train(3, CFG, min_workers=2, workdir=tmp_path / "clean")
    # the replacement comes late, so the two survivors first train on their own
    drill = elastic.train(3, CFG, min_workers=2, kill_every=1.0, max_kills=1, rejoin_after=12.0,
                          workdir=tmp_path / "drill")
    assert clean["final"]["step"] == drill["final"]["step"] == STEPS
    assert clean["restarts"] == 0 and len(drill["kills"]) == 1 and drill["restarts"] >= 1
    killed_at = drill["kills"][0]["step"]
    resumed = [e["step"] for e in drill["events"][1:]]
    # every recovery starts from a committed step at least as late as what was committed at the
    # kill (nothing committed is lost), and steps never go backwards (nothing is applied twice)
    assert resumed[0] >= killed_at and resumed == sorted(resumed)
    # every start logged a digest, which is written only after all ranks matched it (a
    # mismatch raises in the worker; that refusal path itself has no test of its own)
    assert all(len(e["sha256"]) == 64 for e in drill["events"])
    assert 2 in {e["world_size"] for e in drill["events"][1:]}       # the survivors re-formed alone
    # the loss is scaled to the global batch, so the lost worker changes only float rounding
    gap = (_parameters(tmp_path / "drill") - _parameters(tmp_path / "clean")).abs().max().item()
    assert gap < 1e-3
    assert abs(drill["history"][-1]["test_accuracy"] - clean["history"][-1]["test_accuracy"]) <= 0.01
    assert [h["epoch"] for h in drill["history"]] == list(range(1, CFG.epochs + 1))


@pytest.mark.parametrize("kwargs, message", [
    (dict(cfg=TrainConfig(algorithm="cerar")), "needs an exact algorithm"),
    (dict(min_workers=0), "min_workers must be an integer in 1..3"),
    (dict(min_workers=4), "min_workers must be an integer in 1..3"),
    (dict(kill_every=5.0, min_workers=3), "min_workers < workers"),
    (dict(kill_every=-1.0, min_workers=2), "positive number of seconds"),
    (dict(cfg=TrainConfig(resync_every=2)), "exact algorithms only"),
])
def test_elastic_refuses_what_it_cannot_do_before_starting(kwargs, message):
    args = dict(workers=3, cfg=TrainConfig(), min_workers=3, kill_every=None) | kwargs
    with pytest.raises(ConfigError, match=message):
        elastic.check(**args)


@pytest.mark.parametrize("argv, message", [
    (["--elastic", "--algorithm", "cerar"], "needs an exact algorithm"),
    (["--kill-every", "5"], "--min-workers and --kill-every need --elastic"),
    (["--elastic", "--plot", "x.png"], "does not combine"),
])
def test_elastic_cli_errors_are_one_line(argv, message):
    # in process: a fresh interpreter per case took 4.5 s, and test_careless_input already runs
    # the CLI as a user does (exit code 2, no traceback)
    from click.testing import CliRunner

    from gradsync.cli import main

    run = CliRunner().invoke(main, ["train", *argv])
    assert run.exit_code == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.parametrize("weight_nudge, step_nudge", [(1e-6, 0), (0.0, 1)])
@pytest.mark.slow
def test_replicas_that_disagree_after_recovery_are_refused_on_every_rank(weight_nudge, step_nudge):
    same = run(bodies.elastic_agreement, 3, 0.0, 0)
    assert len({r["digest"] for r in same}) == 1, same
    for r in run(bodies.elastic_agreement, 3, weight_nudge, step_nudge):
        assert "replicas disagree after recovery: ranks [1] differ from rank 0" in r.get("error", ""), r
    if step_nudge:
        assert "1: 8" in r["error"] and "0: 7" in r["error"], r


@pytest.mark.parametrize("text, message", [
    ('{"config": {"epochs": 3, "lrr": 1}}', "unknown field\\(s\\) 'lrr'"),
    ('{"epochs": 3}', 'expected {"config"'),
    ('{"config": {"algorithm": "cerar"}}', "needs an exact algorithm"),
    ('{"config": {"epochs": "3"}}', "epochs must be an integer >= 1, got '3'"),
    ("{not json", "cannot read it as JSON"),
])
def test_the_elastic_run_directory_config_is_checked_with_a_clear_error(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        elastic.read_config(tmp_path)


def test_the_elastic_run_directory_config_fills_defaults(tmp_path):
    (tmp_path / "config.json").write_text('{"config": {"algorithm": "hierarchical", "epochs": 3}}')
    assert elastic.read_config(tmp_path) == TrainConfig(algorithm="hierarchical", epochs=3)
