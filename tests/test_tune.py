"""Strategy choice: "auto" picks the least predicted time, and crossovers bracket a change."""

import pytest

from gradsync import ConfigError
from gradsync.algorithms import EXACT
from gradsync.model.topology import preset
from gradsync.model.cost import runnable
from gradsync.model.tune import choose, predicted_time, table


def test_choose_is_the_argmin_of_predicted_times():
    topo = preset("ethernet", workers=16)
    for nbytes in (4096, 1 << 20, 256 << 20):
        times = {a: predicted_time(a, topo, nbytes) for a in EXACT if not runnable(a, topo, 16)}
        assert choose(topo, nbytes).label == min(times, key=times.get)


def test_latency_bound_and_bandwidth_bound_choices_differ_on_a_two_level_cluster():
    topo = preset("lowbw-cluster")
    flat = ["central", "ring", "tree", "sharded", "halving_doubling"]
    assert choose(topo, 1024, candidates=flat).label != "ring" and choose(topo, 1 << 30, candidates=flat).label == "ring"


def test_hierarchical_is_chosen_across_two_servers_for_the_traffic_it_saves():
    # 2 servers x 4 GPUs: a flat ring sends 2 (N - 1)/N = 1.75 of the buffer over the
    # 1 Gbit/s link, the hierarchical all-reduce 2 (M - 1)/M = 1 of it
    from gradsync import algorithms
    from gradsync.model.cost import default_options
    from gradsync.model.simulate import simulate

    topo = preset("lowbw-cluster")
    flat = ["central", "host", "sharded", "one_shot", "ring", "tree", "halving_doubling", "pat"]
    assert choose(topo, 1 << 30, candidates=flat + ["hierarchical"]).label == "hierarchical"
    # NCCL's tree moves the same bytes across machines and pipelines them with the chains inside
    assert choose(topo, 1 << 30).label in ("hierarchical", "nccl_tree")
    times = {name: simulate(algorithms.build(name, 8, 1 << 26, **default_options(name, topo, 8)), topo).time
             for name in ("ring", "hierarchical")}
    assert times["ring"] / times["hierarchical"] == pytest.approx(1.75, rel=0.02)


def test_crossover_lies_between_its_grid_points():
    topo, flat = preset("lowbw-cluster"), ["central", "ring", "tree", "sharded", "halving_doubling"]
    rows, crossovers = table(topo, [1024, 1 << 16, 1 << 22, 1 << 28], candidates=flat)
    assert crossovers
    for c in crossovers:
        assert choose(topo, int(c.nbytes * 0.9), candidates=flat).label == c.below or \
            choose(topo, int(c.nbytes * 1.05), candidates=flat).label == c.above


def test_every_change_between_two_grid_points_is_reported():
    # central wins small messages, tree middling ones, ring large ones: two changes, one interval.
    topo, pool = preset("ethernet", 8), ["central", "ring", "tree"]
    _, crossovers = table(topo, [1000, 10**9], candidates=pool)
    assert [(c.below, c.above) for c in crossovers] == [("central", "tree"), ("tree", "ring")]
    for c in crossovers:
        assert choose(topo, int(c.nbytes * 0.97), candidates=pool).label == c.below
        assert choose(topo, int(c.nbytes * 1.03), candidates=pool).label == c.above


def test_large_worker_counts_use_the_closed_forms():
    topo = preset("ethernet", workers=512)
    assert choose(topo, 1 << 30).label in EXACT


def test_empty_candidates_are_refused():
    with pytest.raises(ConfigError):
        choose(preset("pcie-switch-4"), 1000, candidates=())


def test_an_error_budget_lets_cerar_win_on_slow_links():
    from gradsync.model.topology import preset as make
    slow = make("ethernet", workers=8, nic="100Mbit/s")
    assert choose(slow, 64 << 20).label != "cerar"                       # no budget: exact only
    picked = choose(slow, 64 << 20, max_error=1e-2)
    assert picked.algorithm == "cerar"
    from gradsync.coding import cerar
    design = cerar.make(8, picked.kwargs()["components"], "optimized", dtype="float32")
    assert design.predicted_error("float32") <= 1e-2


def test_an_impossible_error_budget_leaves_the_exact_algorithms():
    from gradsync.model.tune import default_candidates
    assert all(c.algorithm != "cerar" for c in default_candidates(8, max_error=1e-9))


def test_auto_simulates_when_the_topology_has_node_costs():
    # a calibrated-like switch: fast links, nodes limited by their copy rate, incast, overheads.
    # The closed forms see only the links and pick sharded; the simulator sees the nodes.
    from gradsync.model.topology import Link, Node, Topology
    from gradsync.model.tune import choose
    nodes = [Node(f"w{i}", "host", 2e9, None, 1e9, 50e-6, 0.5) for i in range(8)]
    nodes += [Node("ps", "cpu", 2e9, None, 1e9, 50e-6, 0.5), Node("sw", "switch")]
    topo = Topology("costly", tuple(nodes), tuple(Link(n.name, "sw", 1e12, 5e-6) for n in nodes[:-1]),
                    tuple(f"w{i}" for i in range(8)), host="ps")
    for nbytes in (10**4, 10**6):
        simulated = choose(topo, nbytes)
        assert choose(topo, nbytes, quick=True) == simulated
        assert simulated.label != "sharded"
