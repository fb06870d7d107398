"""The hierarchical all-reduce: its schedule, its runtime result against numpy, the traffic it
keeps off the network between machines, and how it learns the machines."""

import numpy as np
import pytest
import torch

from gradsync import ConfigError, algorithms
from gradsync.runtime.transport.hosts import local_size
from gradsync.core.schedule import COPY, REDUCE, verify
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


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("machines,local", [(2, 2), (2, 4), (4, 2), (3, 3)])
def test_its_halves_keep_each_rank_on_its_machine_and_send_m_minus_one_over_m_across(kind, machines, local):
    """torch's rank r must end with chunk r: the halves move the buffer's chunks, never the
    ranks (a rank playing another machine's node would send the local phases over the network),
    and a machine's ranks send (M - 1)/M of the buffer out of it in all, as the all-reduce's half."""
    from gradsync.runtime.halves import layout

    n, share = machines * local, 60
    found = layout("hierarchical", kind, n, n * share, f'{{"local_size": {local}}}')
    assert found.node_of_rank == tuple(range(n)) and found.in_place
    t = found.schedule.transfers
    t = t[t["op"] == (REDUCE if kind == "reduce_scatter" else COPY)]       # the half that runs
    leaving = t["src"] // local != t["dst"] // local
    per_machine = np.bincount(t["src"][leaving] // local, weights=t["count"][leaving], minlength=machines)
    np.testing.assert_allclose(per_machine, (machines - 1) / machines * n * share)
    # every chunk r ends (reduce-scatter) or starts (all-gather) complete at node r: emulate it
    rng = np.random.default_rng(n)
    inputs = rng.integers(-99, 99, (n, n * share)).astype(np.float64)
    expected = inputs.sum(axis=0)
    held = inputs.copy() if kind == "reduce_scatter" else np.where(
        np.arange(n * share)[None, :] // share == np.arange(n)[:, None], expected[None, :], np.nan)
    for rnd in np.unique(t["round"]):
        step = t[t["round"] == rnd]
        sent = [held[s["src"], s["offset"]:s["offset"] + s["count"]].copy() for s in step]
        for s, data in zip(step, sent):
            view = held[s["dst"], s["offset"]:s["offset"] + s["count"]]
            view[:] = view + data if kind == "reduce_scatter" else data
    for r in range(n):
        np.testing.assert_array_equal(held[r, r * share:(r + 1) * share] if kind == "reduce_scatter" else held[r],
                                      expected[r * share:(r + 1) * share] if kind == "reduce_scatter" else expected)
