"""Compact schedules against their expanded tables, and the cluster shapes.

The references: the algorithms' own ``schedule`` builders (the expanded table must equal
theirs), and the full simulation of the expanded table (``symmetry=False``: every transfer a
flow), which the compact path must match bit for bit.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gradsync.algorithms import _compact, halving_doubling, hierarchical, host, ring, sharded
from gradsync.cli import main
from gradsync.core.schedule import verify
from gradsync.errors import ConfigError, TopologyError
from gradsync.model.simulate import load_timeline, simulate
from gradsync.model.topology import preset, resolve
from gradsync.model.topology.cluster import cluster

MODULES = {"ring": ring, "sharded": sharded, "host": host, "hierarchical": hierarchical,
           "halving_doubling": halving_doubling}


def canonical(t):
    return t[np.lexsort((t["offset"], t["dst"], t["src"], t["round"]))]


def options(name, topo, n):
    return {"local_size": topo.machine_size(n)} if name == "hierarchical" else {}


@pytest.mark.parametrize("n,elements", [(2, 2), (3, 100), (4, 4096), (5, 12345), (8, 1000), (12, 77777)])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_expansion_is_the_builders_table(name, n, elements):
    kw = {"local_size": 2 if n % 2 == 0 else 1} if name == "hierarchical" else {}
    c, s = MODULES[name].compact(n, elements, **kw), MODULES[name].schedule(n, elements, **kw)
    if name == "halving_doubling" and n & (n - 1):
        assert c is None                         # the fold-in of extra workers breaks the XOR group
        return
    e = c.expand()
    verify(e)
    assert e.options == s.options and e.helpers == s.helpers and c.transfer_count == len(s.transfers)
    if name == "sharded":                     # the builder lists round 1 by destination
        assert np.array_equal(canonical(e.transfers), canonical(s.transfers))
    else:
        assert np.array_equal(e.transfers, s.transfers)
    assert c.equal_chunks == (elements % n == 0 if name != "host" else True) or name == "hierarchical"


def test_halving_doubling_is_simulated_under_the_xor_group():
    result = simulate(halving_doubling.compact(64, 64 * 100), cluster(workers=64))
    assert result.strides == (1,) * 6 and len(result.flow_times[0]) == 2 * 6


def test_no_compact_form_where_the_rule_does_not_give_the_table():
    assert ring.compact(4, 100, rings=[[0, 2, 1, 3]]) is None
    assert ring.compact(4, 3) is None                       # empty chunks
    assert hierarchical.compact(12, 120, local_size=4, inter="halving_doubling") is None     # 3 machines
    assert _compact.build("tree", 4, 100) is None
    with pytest.raises(ConfigError):
        _compact.build("ring", 4, 100, bogus=1)


def same_results(a, b):
    return (a.time == b.time and np.array_equal(a.node_done, b.node_done)
            and all(np.array_equal(x, y) for x, y in ((a.start, b.start), (a.sent, b.sent), (a.done, b.done)))
            and np.array_equal(a.channel_bytes, b.channel_bytes) and np.array_equal(a.channel_busy, b.channel_busy))


TOPOLOGIES = {
    "ethernet": lambda n: preset("ethernet", n), "ring": lambda n: preset("ring", n),
    "pcie-switch-4": lambda n: preset("pcie-switch-4"), "p3.16xlarge": lambda n: preset("p3.16xlarge"),
    "dgx-2": lambda n: preset("dgx-2"), "lowbw-cluster": lambda n: preset("lowbw-cluster"),
    "rail": lambda n: cluster(workers=n, gpus=4), "fat-tree": lambda n: cluster(workers=n, gpus=4, shape="fat-tree",
                                                                              oversubscription=3.0),
}


def check_bit_for_bit(topo_name, n, name, elements):
    topo = TOPOLOGIES[topo_name](n)
    n = len(topo.workers)
    if name == "host" and topo.host is None:
        return
    c = MODULES[name].compact(n, elements, **options(name, topo, n))
    if c is None:                                # halving-doubling off a power of two
        return
    expanded = c.expand()
    full = simulate(expanded, topo, symmetry=False)
    assert same_results(simulate(c, topo), full)
    assert same_results(simulate(expanded, topo), full)


@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("name", sorted(MODULES))
def test_compact_and_expanded_times_bit_for_bit(topo_name, name):
    n = 8 if topo_name in ("ethernet", "ring", "rail", "fat-tree") else None
    for elements in (8 * 3000, 8 * 3000 + 5):
        check_bit_for_bit(topo_name, n or 64, name, elements)


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 4, 6, 16, 24, 32, 48, 64])
def test_compact_and_expanded_bit_for_bit_up_to_64(n):
    for topo_name in ("ethernet", "ring", "rail", "fat-tree"):
        if topo_name in ("rail", "fat-tree") and n % 4:
            continue
        for name in MODULES:
            for elements in (n * 1000, n * 1000 + 7):
                check_bit_for_bit(topo_name, n, name, elements)


def test_the_subgroups_are_the_ones_the_topology_keeps():
    on_switch = simulate(ring.compact(16, 1600), preset("ethernet", 16))
    on_cluster = simulate(ring.compact(16, 1600), cluster(workers=16, gpus=4))
    grid = simulate(hierarchical.compact(16, 1600, local_size=4), cluster(workers=16, gpus=4))
    assert (on_switch.strides, on_cluster.strides, grid.strides) == ((1,), (4,), (1, 1))
    assert len(on_cluster.flow_times[0]) == 4 * 30 and len(grid.flow_times[0]) == 2 * 3 + 2 * 3


@pytest.mark.parametrize("name,n,local", [("ring", 64, None), ("hierarchical", 64, 8), ("sharded", 32, None)])
@pytest.mark.parametrize("over", [1.0, 3.0])
def test_unequal_chunks_at_scale_by_size_classes(name, n, local, over):
    topo = cluster(workers=n, gpus=8, shape="fat-tree", oversubscription=over)
    kw = {"local_size": local} if local else {}
    c = MODULES[name].compact(n, n * 2000 + 1, **kw)
    classes = simulate(c, topo, expand_limit=0)
    exact = simulate(c.expand(), topo, symmetry=False)
    low, high = classes.classes
    assert low < high and classes.time == high
    if over == 1.0:                     # nothing shared: the classes bracket the exact time
        assert low <= exact.time <= high * (1 + 1e-12)
    else:                               # shared uplinks: unequal chunks spread the workers (measured: <= 1.7%)
        assert abs(exact.time - high) <= 0.03 * exact.time
    assert simulate(c, topo).classes is None and simulate(c, topo).time == exact.time   # small: expanded


def test_compact_timeline_round_trip(tmp_path):
    topo = cluster(workers=32, gpus=8)
    c = hierarchical.compact(32, 32 * 1000, local_size=8)
    result = simulate(c, topo)
    result.save(tmp_path / "h.npz")
    data = load_timeline(tmp_path / "h.npz")
    full = simulate(c.expand(), topo, symmetry=False)
    assert np.array_equal(data["timeline"]["done"], full.done) and data["time_s"] == full.time
    assert len(data["compact"]["flow_done"]) == len(c.program)
    assert "timeline" not in load_timeline(tmp_path / "h.npz", expand=False)


def test_cluster_routes():
    t = cluster(machines=2, gpus=4)
    names = lambda a, b: [t.nodes[i].name for i in t.route_nodes(a, b)]   # noqa: E731
    assert names("m0g1", "m0g2") == ["m0g1", "m0nvs", "m0g2"]
    assert names("m0g1", "m1g1") == ["m0g1", "rail1", "m1g1"]
    assert names("m0g1", "m1g2") == ["m0g1", "rail1", "spine", "rail2", "m1g2"]
    f = cluster(machines=2, gpus=4, shape="fat-tree", oversubscription=4)
    assert [f.nodes[i].name for i in f.route_nodes("m0g1", "m1g1")] == ["m0g1", "tor0", "spine", "tor1", "m1g1"]
    uplink = [l for l in f.links if l.b == "spine"][0]
    assert uplink.bandwidth == 4 * 50e9 / 4 and t.machine_size() == 4
    channels, latency = t.route("m0g1", "m1g2")
    assert len(channels) == 4 and latency == pytest.approx(3e-6)


def test_cluster_as_preset_text_and_file(tmp_path):
    text = resolve("cluster:machines=4,gpus=8,shape=fat-tree,oversubscription=2")
    path = tmp_path / "c.toml"
    path.write_text('name = "mine"\ncluster = {machines = 4, gpus = 8, shape = "fat-tree", oversubscription = 2}\n')
    from_file = resolve(str(path))
    assert from_file.name == "mine" and len(from_file.workers) == 32
    assert [l.bandwidth for l in from_file.links] == [l.bandwidth for l in text.links]
    c = ring.compact(32, 32 * 100)
    assert simulate(c, from_file).time == simulate(c, text).time
    for bad, word in (("cluster:shape=mesh", "shape"), ("cluster:oversubscription=0", "oversubscription"),
                      ("cluster:bogus=1", "bogus"), ("cluster:machines", "KEY=VALUE")):
        with pytest.raises(TopologyError, match=word):
            resolve(bad)
    path.write_text('cluster = {machines = 4}\nnodes = []\n')
    with pytest.raises(TopologyError, match="nodes"):
        resolve(str(path))


def test_cli_simulates_a_cluster_compactly(tmp_path):
    runner = CliRunner()
    out = tmp_path / "run.npz"
    topo = cluster(machines=32, gpus=8)
    for size, elements in (("1GB", 250_000_000), ("1GiB", 1 << 28)):
        got = runner.invoke(main, ["simulate", "-a", "hierarchical", "-t", "cluster:machines=32,gpus=8", "-s", size,
                                   "--out", str(out), "--format", "json"])
        assert got.exit_code == 0, got.output
        summary = json.loads(got.output[got.output.index("{"):])
        c = hierarchical.compact(256, elements, local_size=8)
        assert summary["time_s"] == simulate(c, topo).time == simulate(c.expand(), topo, symmetry=False).time
    assert load_timeline(out, expand=False)["compact"]["strides"] == (1, 1)      # 1 GiB: equal chunks
    refused = runner.invoke(main, ["simulate", "-a", "tree", "-t", "cluster:machines=256", "-s", "1MB"])
    assert refused.exit_code == 2 and "no compact form" in refused.output and "2048" in refused.output


def costly():
    from gradsync.model.topology import Link, Node, Topology
    nodes = [Node(f"w{i}", "host", 2e9, 1e10, 3e9, 20e-6, 0.1, 1e-3, round_overhead=5e-6) for i in range(5)]
    nodes += [Node("ps", "cpu", 2e9, 1e10, 3e9, 20e-6, 0.1, 1e-3), Node("sw", "switch", cores=2, copy_rate=8e9)]
    links = [Link(n.name, "sw", 5e9, 1e-6, "half") for n in nodes[:-1]]
    return Topology("costly", tuple(nodes), tuple(links), tuple(f"w{i}" for i in range(5)), host="ps")


@pytest.mark.parametrize("topo", [costly, lambda: cluster(workers=16, gpus=4, shape="fat-tree", oversubscription=3.0),
                                  lambda: preset("p3.16xlarge")])
def test_the_two_event_loops_agree_bit_for_bit(topo):
    from gradsync import algorithms
    from gradsync.model.cost import default_options
    from gradsync.model.simulate.engine import _run
    from gradsync.model.simulate.flows import _full
    from gradsync.model.simulate.network import _Net, _placement
    from gradsync.model.simulate.scalar import _run_scalar
    topo = topo()
    n = len(topo.workers)
    for name in ("central", "host", "sharded", "ring", "tree", "halving_doubling", "hierarchical", "cerar"):
        if name == "host" and topo.host is None:
            continue
        s = algorithms.build(name, n, n * 1000 + 3, **default_options(name, topo, n))
        system = _full(s, _Net.of(topo, _placement(s, topo)), 4)
        for a, b in zip(_run(system), _run_scalar(system)):
            assert np.array_equal(a, b, equal_nan=True), name


def test_verify_and_narrate_read_a_compact_schedule():
    from gradsync.core.narrate import narrate
    from gradsync.errors import ScheduleError
    c = hierarchical.compact(8, 64, local_size=4)
    verify(c)
    cuts = [0, 16, 32, 48, 64]
    assert narrate(c, cuts) == narrate(hierarchical.schedule(8, 64, local_size=4), cuts)
    from dataclasses import replace
    good = ring.compact(4, 100)
    program = good.program.copy()
    program["dst"][2] = 2                          # one round sends to the wrong neighbour
    with pytest.raises(ScheduleError):
        verify(replace(good, program=program))


@pytest.mark.parametrize("topo_name", ["ethernet", "rail", "fat-tree", "lowbw-cluster"])
def test_hierarchical_with_halving_doubling_rails(topo_name):
    topo = TOPOLOGIES[topo_name](64 if topo_name != "lowbw-cluster" else None)
    n, local = len(topo.workers), 4
    for elements in (n * 1000, n * 1000 + 5):
        c = hierarchical.compact(n, elements, local_size=local, inter="halving_doubling")
        assert np.array_equal(c.expand().transfers,
                              hierarchical.schedule(n, elements, local_size=local, inter="halving_doubling").transfers)
        assert same_results(simulate(c, topo), simulate(c.expand(), topo, symmetry=False))
    assert hierarchical.compact(24, 2400, local_size=4, inter="halving_doubling") is None    # 6 machines
