"""The simulator against D2L's figures, hand-worked max-min sharing, and the closed forms."""

import numpy as np
import pytest

from gradsync import Schedule, schedule
from gradsync.algorithms import EXACT
from gradsync.model.cost import default_options, predict, runnable
from gradsync.core.schedule import REDUCE, transfers
from gradsync.model.simulate import simulate
from gradsync.model.topology import Link, Node, Topology, preset

MB = 10**6


def star(bandwidths, latency=0.0, rate=None):
    nodes = [Node(f"w{i}", "gpu", rate) for i in range(len(bandwidths))] + [Node("sw", "switch")]
    links = [Link(f"w{i}", "sw", b, latency) for i, b in enumerate(bandwidths)]
    return Topology("star", tuple(nodes), tuple(links), tuple(n.name for n in nodes[:-1]))


def handmade(workers, rows):
    table = np.concatenate([transfers(*r) for r in rows])
    return Schedule("handmade", workers, int((table["offset"] + table["count"]).max()), table)


@pytest.mark.parametrize("algorithm,ms", [("central", 60), ("host", 80), ("sharded", 15)])
def test_seed_figures_on_the_pcie_server(algorithm, ms):
    topo = preset("pcie-switch-4")
    result = simulate(schedule(algorithm, 4, 160 * MB // 4), topo)
    assert result.time == pytest.approx(ms / 1e3, rel=1e-3)


def test_seed_ring_figure_on_p3():
    topo = preset("p3.16xlarge")
    result = simulate(schedule("ring", 8, 160 * MB // 4, **default_options("ring", topo, 8)), topo)
    exact = 2 * 7 / 8 * 160 * MB / (3 * 18e9)           # 5.19 ms, before latencies
    assert exact < result.time < exact + 14 * 3e-6
    assert 5.1e-3 < result.time < 6.0e-3


def test_max_min_sharing_and_re_sharing_when_a_flow_ends():
    # w0 -> w1 (24 B) and w2 -> w1 (12 B) share w1's downlink (10 B/s); w2's uplink caps it at 4.
    topo = star([10, 10, 4])
    result = simulate(handmade(3, [(0, 0, 1, 0, 24, REDUCE), (0, 2, 1, 0, 12, REDUCE)]), topo, itemsize=1)
    t = result.schedule.transfers
    sent = {(int(s), int(d)): result.sent[i] for i, (s, d) in enumerate(zip(t["src"], t["dst"]))}
    assert sent[(2, 1)] == pytest.approx(3.0)             # 12 B at 4 B/s
    assert sent[(0, 1)] == pytest.approx(3.0 + 6 / 10)    # 18 B at 6 B/s, then 6 B at 10 B/s
    assert result.channel_busy[2 * 1 + 1] == pytest.approx(3.6)   # w1's downlink busy throughout


def test_latency_is_added_once_per_hop():
    topo = star([1e9, 1e9], latency=5e-6)
    result = simulate(handmade(2, [(0, 0, 1, 0, 1000, REDUCE)]), topo, itemsize=1)
    assert result.done[0] - result.sent[0] == pytest.approx(10e-6)
    assert result.time == pytest.approx(10e-6 + 1000 / 1e9)


def test_no_global_barrier_between_rounds():
    # w2 <-> w3 finish their small round 0 long before w0 -> w1 does, and go on at once.
    topo = star([1.0] * 4)
    s = handmade(4, [(0, 0, 1, 0, 100, REDUCE), (0, 2, 3, 0, 1, REDUCE), (1, 3, 2, 0, 1, REDUCE)])
    result = simulate(s, topo, itemsize=1)
    t = result.schedule.transfers
    late = np.flatnonzero(t["round"] == 1)[0]
    assert result.start[late] == pytest.approx(1.0) and result.time == pytest.approx(100.0)


def test_compute_is_charged_after_the_reduction():
    topo = star([1e9, 1e9], rate=1e6)
    result = simulate(schedule("central", 2, 1000), topo)    # primary reduces 1000 elements: 1 ms
    back = np.flatnonzero(result.schedule.transfers["round"] == 1)[0]
    assert result.start[back] - result.done.min() == pytest.approx(1e-3, rel=1e-9)


UNCONTENDED = [("pcie-switch-4", None), ("ethernet", 2), ("ethernet", 5), ("ethernet", 6), ("ethernet", 8), ("ethernet", 13),
               ("dgx-2", 16)]


@pytest.mark.parametrize("topology,workers", UNCONTENDED)
@pytest.mark.parametrize("algorithm", EXACT)
@pytest.mark.parametrize("nbytes", [4 * 1024, 64 * MB])
def test_simulator_agrees_with_closed_form_within_one_percent(topology, workers, algorithm, nbytes):
    topo = preset(topology, workers)
    n = len(topo.workers)
    if algorithm == "host" and topology == "dgx-2":
        pytest.skip("dgx-2's host sits behind a shared PCIe switch: contended by design")
    if runnable(algorithm, topo, n):
        pytest.skip(runnable(algorithm, topo, n))      # no switch that reduces: test_gpu_machines.py times those
    options = default_options(algorithm, topo, n)
    simulated = simulate(schedule(algorithm, n, nbytes // 4, **options), topo).time
    predicted = predict(algorithm, topo, n, nbytes, **options)
    if algorithm == "tree" and (n + 1) & n and nbytes < 16 * MB:
        # an incomplete tree: its shallower branches run ahead of the lock-step count
        assert simulated * (1 - 1e-9) <= predicted <= 1.15 * simulated
    else:
        assert predicted == pytest.approx(simulated, rel=0.01)


def test_tree_closed_form_does_not_read_the_schedule(monkeypatch):
    # The simulator check below is only a check if the formula is derived apart from the
    # schedule it times: tree.cost counts loads from the pipeline's timing rule, not schedule().
    from gradsync.algorithms import tree
    expected = predict("tree", preset("ethernet", 13), 13, 4096)
    monkeypatch.setattr(tree, "schedule", lambda *a, **k: pytest.fail("tree.cost built a schedule"))
    assert predict("tree", preset("ethernet", 13), 13, 4096) == expected


def test_empty_and_one_worker_schedules_take_no_time():
    for algorithm in EXACT + ("cerar",):
        assert simulate(schedule(algorithm, 1, 0), preset("ethernet", 1)).time == 0.0
        assert simulate(schedule(algorithm, 3, 0), preset("ethernet", 3)).time == 0.0
    one = simulate(schedule("ring", 1, 1000), preset("ethernet", 1))
    assert one.time == 0.0 and one.to_dict()["rounds"] == 0 and one.busiest_channel() == ("-", 0.0)


@pytest.mark.parametrize("workers", [3, 6, 7, 13, 15, 20, 31])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 64 << 20])
def test_tree_formula_exact_for_complete_trees_else_an_upper_bound(workers, nbytes):
    # The formula (tree.cost) is derived from the timing rule, independently of tree.schedule
    # (see the test above). It is exact only for complete trees (N = 2^k - 1) and for
    # bandwidth-bound messages; for the other trees it is the lock-step count, which the
    # shallower branches beat, so there the check is only the documented band.
    topo = preset("ethernet", workers)
    simulated = simulate(schedule("tree", workers, nbytes // 4), topo).time
    predicted = predict("tree", topo, workers, nbytes)
    if (workers + 1) & workers == 0 or nbytes >= 16 * MB:      # N = 2^k - 1, or bandwidth-bound
        assert predicted == pytest.approx(simulated, rel=0.01)
    else:
        assert simulated * (1 - 1e-9) <= predicted <= 1.15 * simulated


def test_timeline_json_has_every_transfer():
    topo = preset("ethernet", workers=6)
    result = simulate(schedule("ring", 6, 600), topo)
    data = result.to_dict()
    assert len(data["timeline"]["start"]) == len(result.schedule.transfers) == 2 * 5 * 6
    assert all(s <= e for s, e in zip(data["timeline"]["start"], data["timeline"]["done"]))
    assert data["time_s"] == pytest.approx(max(data["timeline"]["done"]) + 0.0, rel=1e-9, abs=1e-3)
    assert sum(l["bytes"] for l in data["links"]) == pytest.approx(2 * 10 * 6 * 100 * 4)  # 2 hops each


def test_worker_count_beyond_the_topology_is_refused():
    from gradsync import ConfigError
    with pytest.raises(ConfigError, match="has 4 worker devices"):
        simulate(schedule("ring", 5, 10), preset("pcie-switch-4"))


SYMMETRIC = [("ring", "ethernet", 7, 7 * 1000), ("sharded", "ethernet", 5, 5 * 64), ("host", "ethernet", 4, 999),
             ("cerar", "ethernet", 4, 4 * 96), ("ring", "ring", 6, 6 * 50), ("sharded", "pcie-switch-4", 4, 400)]


@pytest.mark.parametrize("algorithm,topology,workers,elements", SYMMETRIC)
def test_symmetric_shortcut_gives_the_full_simulation_bit_for_bit(algorithm, topology, workers, elements):
    topo = preset(topology, workers=workers)
    s = schedule(algorithm, workers, elements, **default_options(algorithm, topo, workers))
    fast, full = simulate(s, topo), simulate(s, topo, symmetry=False)
    assert fast.orbit is not None and full.orbit is None       # the shortcut was taken, and only where asked
    assert len(fast.flow_times[0]) * workers == len(s.transfers)
    for name in ("start", "sent", "done", "node_done", "channel_bytes", "channel_busy", "round_end"):
        assert np.array_equal(getattr(fast, name), getattr(full, name)), name
    assert fast.time == full.time


@pytest.mark.parametrize("algorithm,topology,workers,elements", [
    ("ring", "ethernet", 6, 6 * 100 + 1),            # unequal chunks
    ("ring", "lowbw-cluster", 8, 800),               # workers on unequal routes
    ("central", "ethernet", 5, 500), ("tree", "ethernet", 6, 600)])
def test_asymmetric_runs_are_simulated_in_full(algorithm, topology, workers, elements):
    topo = preset(topology, workers=workers)
    assert simulate(schedule(algorithm, workers, elements), topo).orbit is None


@pytest.mark.parametrize("symmetric", [True, False])
def test_timeline_npz_round_trips(tmp_path, symmetric):
    from gradsync.model.simulate import load_timeline
    topo = preset("ethernet", workers=6)
    result = simulate(schedule("ring", 6, 600 if symmetric else 601), topo)
    assert (result.orbit is not None) == symmetric
    result.save(tmp_path / "t.npz")
    result.save(tmp_path / "t.json")
    for name in ("t.npz", "t.json"):
        data = load_timeline(tmp_path / name)
        assert data["time_s"] == result.time and data["workers"] == 6
        for column in ("start", "sent", "done"):
            assert np.array_equal(data["timeline"][column], getattr(result, column))
        for column in ("src", "dst", "count", "op", "round", "offset"):
            assert np.array_equal(data["timeline"][column], result.schedule.transfers[column])


def test_timeline_refuses_other_formats(tmp_path):
    from gradsync import ConfigError
    from gradsync.model.simulate import load_timeline
    result = simulate(schedule("ring", 3, 30), preset("ethernet", workers=3))
    with pytest.raises(ConfigError, match="npz or .json"):
        result.save(tmp_path / "t.csv")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="cannot read timeline"):
        load_timeline(tmp_path / "bad.npz")


def star_with(costs, workers=3, bandwidth=1e9):
    """A star whose worker nodes carry ``costs`` (copy_rate, message_overhead, fan_in)."""
    nodes = [Node(f"w{i}", "host", **costs) for i in range(workers)] + [Node("sw", "switch")]
    links = [Link(f"w{i}", "sw", bandwidth) for i in range(workers)]
    return Topology("star", tuple(nodes), tuple(links), tuple(f"w{i}" for i in range(workers)))


def test_message_overhead_is_charged_per_message_at_both_ends():
    plain = simulate(handmade(2, [(0, 0, 1, 0, 1000, REDUCE)]), star_with({}, 2), itemsize=1)
    costly = simulate(handmade(2, [(0, 0, 1, 0, 1000, REDUCE)]), star_with({"message_overhead": 1e-3}, 2), itemsize=1)
    assert costly.node_done.tolist() == pytest.approx([plain.time + 1e-3] * 2, rel=1e-12)
    # three messages into w0 in one round: w0 pays three overheads, each sender one
    fan = handmade(4, [(0, 1, 0, 0, 10, REDUCE), (0, 2, 0, 0, 10, REDUCE), (0, 3, 0, 0, 10, REDUCE)])
    r = simulate(fan, star_with({"message_overhead": 1e-3}, 4, bandwidth=1e12), itemsize=1)
    assert r.node_done[0] - r.done.max() == pytest.approx(3e-3, rel=1e-9)
    assert r.node_done[1] - r.done[0] == pytest.approx(1e-3, rel=1e-9)


def test_copy_rate_is_shared_by_everything_a_node_sends_and_receives():
    # links far faster than the nodes: the receiver's copy rate bounds the fan-in of 3 x 1 MB
    fan = handmade(4, [(0, 1, 0, 0, MB, REDUCE), (0, 2, 0, 0, MB, REDUCE), (0, 3, 0, 0, MB, REDUCE)])
    r = simulate(fan, star_with({"copy_rate": 1e9}, 4, bandwidth=1e12), itemsize=1)
    assert r.time == pytest.approx(3 * MB / 1e9, rel=1e-9)
    # an exchange: each node sends and receives 1 MB through one copy channel, half its rate each way
    swap = handmade(2, [(0, 0, 1, 0, MB, REDUCE), (0, 1, 0, 0, MB, REDUCE)])
    assert simulate(swap, star_with({"copy_rate": 1e9}, 2, bandwidth=1e12), itemsize=1).time == pytest.approx(2e-3)
    # one way, the whole rate
    one = handmade(2, [(0, 0, 1, 0, MB, REDUCE)])
    assert simulate(one, star_with({"copy_rate": 1e9}, 2, bandwidth=1e12), itemsize=1).time == pytest.approx(1e-3)


def test_fan_in_slows_a_receiver_per_extra_concurrent_sender():
    fan = handmade(4, [(0, 1, 0, 0, MB, REDUCE), (0, 2, 0, 0, MB, REDUCE), (0, 3, 0, 0, MB, REDUCE)])
    r = simulate(fan, star_with({"copy_rate": 1e9, "fan_in": 0.25}, 4, bandwidth=1e12), itemsize=1)
    assert r.time == pytest.approx(3 * MB / (1e9 / (1 + 0.25 * 2)), rel=1e-9)
    one = handmade(2, [(0, 0, 1, 0, MB, REDUCE)])       # a single sender pays no incast
    assert simulate(one, star_with({"copy_rate": 1e9, "fan_in": 0.25}, 2, bandwidth=1e12),
                    itemsize=1).time == pytest.approx(1e-3)


def test_collective_overhead_delays_each_node_first_round_once():
    one = handmade(2, [(0, 0, 1, 0, 1000, REDUCE), (1, 1, 0, 0, 1000, REDUCE)])
    plain = simulate(one, star_with({}, 2), itemsize=1)
    late = simulate(one, star_with({"collective_overhead": 2e-3}, 2), itemsize=1)
    assert late.start.tolist() == pytest.approx([2e-3, plain.start[1] + 2e-3], rel=1e-12)   # not per round
    assert late.time == pytest.approx(plain.time + 2e-3, rel=1e-12)
    # a receiver that starts late holds back its sender: a transfer starts when both ends are in its round
    nodes = (Node("w0", "host"), Node("w1", "host", collective_overhead=5e-3), Node("sw", "switch"))
    topo = Topology("star", nodes, (Link("w0", "sw", 1e9), Link("w1", "sw", 1e9)), ("w0", "w1"))
    assert simulate(handmade(2, [(0, 0, 1, 0, 1000, REDUCE)]), topo, itemsize=1).start[0] == pytest.approx(5e-3)


def machine_star(cores, reduce_rate, workers=4):
    nodes = [Node(f"w{i}", "host", reduce_rate) for i in range(workers)] + [Node("sw", "switch", cores=cores)]
    return Topology("machine", tuple(nodes), tuple(Link(f"w{i}", "sw", 1e12) for i in range(workers)),
                    tuple(f"w{i}" for i in range(workers)))


def test_nodes_computing_at_once_share_their_machine_cores():
    ring, central = schedule("ring", 4, 4 * MB), schedule("central", 4, 4 * MB)
    # every ring round has all 4 workers adding: on 2 cores each at half its rate
    assert simulate(ring, machine_star(2, 1e9)).time == pytest.approx(simulate(ring, machine_star(None, 5e8)).time,
                                                                     rel=1e-12)
    # central's root adds alone: at its full rate
    assert simulate(central, machine_star(2, 1e9)).time == pytest.approx(
        simulate(central, machine_star(None, 1e9)).time, rel=1e-12)
    assert simulate(ring, machine_star(8, 1e9)).time == pytest.approx(simulate(ring, machine_star(None, 1e9)).time,
                                                                     rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "sharded", "host"])
def test_symmetric_shortcut_holds_with_node_costs(algorithm):
    nodes = [Node(f"w{i}", "host", 2e9, None, 3e9, 20e-6, 0.1, 1e-3) for i in range(5)]
    nodes += [Node("ps", "cpu", 2e9, None, 3e9, 20e-6, 0.1, 1e-3), Node("sw", "switch", cores=2)]
    links = [Link(n.name, "sw", 5e9, 1e-6, "half") for n in nodes[:-1]]
    topo = Topology("costly", tuple(nodes), tuple(links), tuple(f"w{i}" for i in range(5)), host="ps")
    s = schedule(algorithm, 5, 5 * 4000)
    fast, full = simulate(s, topo), simulate(s, topo, symmetry=False)
    assert fast.orbit is not None
    assert np.array_equal(fast.done, full.done) and np.array_equal(fast.node_done, full.node_done)
    assert np.array_equal(fast.channel_busy, full.channel_busy)


def test_a_switch_copy_rate_is_shared_by_every_transfer_crossing_it():
    # one machine's processes: two disjoint one-way transfers through a switch that copies at
    # 1 GB/s get half each; alone, one gets all of it
    nodes = [Node(f"w{i}", "host") for i in range(4)] + [Node("sw", "switch", copy_rate=1e9)]
    topo = Topology("machine", tuple(nodes), tuple(Link(f"w{i}", "sw", 1e12) for i in range(4)),
                    tuple(f"w{i}" for i in range(4)))
    two = handmade(4, [(0, 0, 1, 0, MB, REDUCE), (0, 2, 3, 0, MB, REDUCE)])
    assert simulate(two, topo, itemsize=1).time == pytest.approx(2e-3)
    assert simulate(handmade(2, [(0, 0, 1, 0, MB, REDUCE)]), topo.with_workers(2), itemsize=1).time == pytest.approx(1e-3)
    s = schedule("ring", 4, 4000)               # and the symmetric shortcut keeps it exact
    fast, full = simulate(s, topo), simulate(s, topo, symmetry=False)
    assert fast.orbit is not None and np.array_equal(fast.done, full.done)
    assert fast.time == pytest.approx(6 * 4000 * 4 / 1e9, rel=1e-6)   # each round moves the 16 KB through it
