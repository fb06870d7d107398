"""The hierarchical all-reduce: its schedule, its runtime result against numpy, the traffic it
keeps off the network between machines, and how it learns the machines."""

import numpy as np
import pytest
import torch

from gradsync import ConfigError, algorithms
from gradsync.runtime.transport.hosts import local_size
from gradsync.core.schedule import verify
from gradsync.model.topology import preset
from gradsync.model.topology.presets import lowbw_cluster
from thread_groups import run_group


@pytest.mark.parametrize("workers,local,inter", [(4, 2, "ring"), (6, 3, "ring"), (6, 2, "halving_doubling"),
                                                 (8, 4, "halving_doubling"), (6, 1, "ring"), (5, 5, "ring")])
@pytest.mark.parametrize("elements", [0, 5, 100_003])
def test_every_rank_gets_the_exact_sum(workers, local, inter, elements):
    rng = np.random.default_rng(workers * 7 + local)
    inputs = [torch.tensor(rng.integers(-1000, 1000, elements), dtype=torch.float64) for _ in range(workers)]
    expected = np.sum([x.numpy() for x in inputs], axis=0)
    verify(algorithms.build("hierarchical", workers, elements, local_size=local, inter=inter))
    for r, got in enumerate(run_group(inputs, "hierarchical", 1, local_size=local, inter=inter)):
        assert isinstance(got, torch.Tensor), got
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=f"rank {r}")


@pytest.mark.parametrize("machines,local", [(2, 2), (2, 4), (4, 2), (3, 3)])
def test_only_two_m_minus_one_over_m_of_the_buffer_leaves_each_machine(machines, local):
    n, elements = machines * local, 1200 * machines * local
    t = algorithms.build("hierarchical", n, elements, local_size=local).transfers
    leaving = t["src"] // local != t["dst"] // local
    per_machine = np.bincount(t["src"][leaving] // local, weights=t["count"][leaving], minlength=machines)
    np.testing.assert_allclose(per_machine, 2 * (machines - 1) / machines * elements)
    flat = algorithms.build("ring", n, elements).transfers
    out = np.bincount(flat["src"][flat["src"] // local != flat["dst"] // local] // local,
                      weights=flat["count"][flat["src"] // local != flat["dst"] // local], minlength=machines)
    # a flat ring crosses each boundary link with 2 (N - 1)/N of the buffer
    np.testing.assert_allclose(out, 2 * (n - 1) / n * elements)


def test_closed_form_matches_the_simulator_across_servers():
    from gradsync.model.cost import default_options, predict
    from gradsync.model.simulate import simulate

    for servers, gpus in ((2, 2), (2, 4), (4, 2)):
        topo = lowbw_cluster(servers, gpus)
        n = servers * gpus
        options = default_options("hierarchical", topo, n)
        assert options["local_size"] == gpus
        sim = simulate(algorithms.build("hierarchical", n, 1 << 24, **options), topo).time
        assert predict("hierarchical", topo, n, 4 << 24) == pytest.approx(sim, rel=0.02)


def test_machines_come_from_the_topology_and_the_launch(monkeypatch):
    assert preset("lowbw-cluster").machine_size() == 4
    assert preset("ethernet", 8).machine_size() == 8 and preset("dgx-2").machine_size() == 16
    monkeypatch.delenv("GRADSYNC_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert local_size(6) == 2 and local_size(5) == 5          # a size that does not divide: one machine
    monkeypatch.setenv("GRADSYNC_LOCAL_SIZE", "3")
    assert local_size(6) == 3


@pytest.mark.parametrize("options,message", [({"local_size": 3}, "not a multiple of local_size = 3"),
                                             ({"local_size": 0}, "local_size must be an integer >= 1"),
                                             ({"inter": "tree"}, "inter must be one of ring, halving_doubling")])
def test_bad_groupings_are_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message):
        algorithms.build("hierarchical", 4, 100, **options)
