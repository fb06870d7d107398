"""Topologies: presets as D2L's "Parameter Servers" chapter describes them, files in three formats, clear errors."""

import json
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradsync import TopologyError
from gradsync.model.topology import PRESETS, from_dict, load, loads, preset

GOOD = {
    "name": "two",
    "nodes": [{"name": "g0", "kind": "gpu"}, {"name": "g1", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"},
              {"name": "sw", "kind": "switch"}],
    "links": [{"a": "g0", "b": "sw", "bandwidth": "16GB/s", "latency": "1us"},
              {"a": "g1", "b": "sw", "bandwidth": 16e9}, {"a": "cpu", "b": "sw", "bandwidth": "128Gbit/s"}],
    "workers": ["g0", "g1"],
    "host": "cpu",
}


@pytest.mark.parametrize("name", PRESETS)
def test_presets_route_between_every_pair_of_workers(name):
    topo = preset(name)
    for a in topo.workers:
        for b in topo.workers:
            channels, latency = topo.route(a, b)
            assert (len(channels) == 0) == (a == b) and latency >= 0
    if topo.host:
        assert topo.route(topo.workers[0], topo.host)[0]


def test_p3_has_six_nvlinks_per_gpu_and_two_rings_covering_them():
    topo = preset("p3.16xlarge")
    nvlink = [l for l in topo.links if l.a.startswith("gpu") and l.b.startswith("gpu")]
    for g in range(8):
        assert sum(l.bandwidth for l in nvlink if f"gpu{g}" in (l.a, l.b)) == 6 * 18e9
    for ring, hop in zip(topo.rings, (36e9, 18e9)):
        for i in range(8):
            a, b = f"gpu{ring[i]}", f"gpu{ring[(i + 1) % 8]}"
            assert topo.route_nodes(a, b) == [topo.index[a], topo.index[b]]
            assert 1 / topo.path_alpha_beta(a, b)[1] == hop


def test_pcie_switch_matches_the_seed():
    topo = preset("pcie-switch-4")
    assert len(topo.workers) == 4 and topo.host == "cpu"
    assert {l.bandwidth for l in topo.links} == {16e9} and len(topo.links) == 5


def test_ethernet_is_parametric():
    topo = preset("ethernet", workers=300)
    assert len(topo.workers) == 300 and topo.route_nodes("host0", "host299")[1] == topo.index["switch"]


@pytest.mark.parametrize("suffix,dump", [(".json", json.dumps), (".yaml", yaml.safe_dump)])
def test_json_and_yaml_files_load(tmp_path, suffix, dump):
    path = tmp_path / f"t{suffix}"
    path.write_text(dump(GOOD))
    topo = load(path)
    assert topo.links[2].bandwidth == 16e9 and topo.links[0].latency == 1e-6


def test_toml_file_loads(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('name = "two"\nworkers = ["g0", "g1"]\nhost = "cpu"\n'
                    'nodes = [{name = "g0", kind = "gpu"}, {name = "g1", kind = "gpu"}, '
                    '{name = "cpu", kind = "cpu"}, {name = "sw", kind = "switch"}]\n'
                    'links = [{a = "g0", b = "sw", bandwidth = "16GB/s", latency = "1us"}, '
                    '{a = "g1", b = "sw", bandwidth = "16GB/s"}, {a = "cpu", b = "sw", bandwidth = "16GB/s"}]\n')
    assert load(path).route_nodes("g0", "g1") == [0, 3, 1]


@pytest.mark.parametrize("change,message", [
    (lambda d: d["links"][1].update(bandwidth="fast"), r"links\.1\.bandwidth: bad bandwidth 'fast'"),
    (lambda d: d["links"][1].update(bandwidth=-3), r"links\.1\.bandwidth"),
    (lambda d: d["links"][0].update(latency="soon"), r"links\.0\.latency"),
    (lambda d: d["links"][0].update(b="nowhere"), r"links\.0\.b: unknown node 'nowhere'"),
    (lambda d: d["nodes"][0].update(kind="tpu"), r"nodes\.0\.kind"),
    (lambda d: d["workers"].append("ghost"), r"workers\.2: unknown node 'ghost'"),
    (lambda d: d.update(host="ghost"), r"host: unknown node 'ghost'"),
    (lambda d: d.update(colour="red"), r"colour: Extra inputs are not permitted"),
    (lambda d: d["links"].pop(), r"not all connected"),
    (lambda d: d["nodes"].append({"name": "g0", "kind": "gpu"}), r"name 'g0' appears twice"),
    (lambda d: d.update(rings=[[0, 0]]), r"rings\.0: must be a permutation"),
])
def test_errors_name_the_bad_field(change, message):
    data = json.loads(json.dumps(GOOD))
    change(data)
    with pytest.raises(TopologyError, match=message):
        from_dict(data, "t.json")


def test_syntax_errors_are_one_line():
    for text, suffix in [("{", ".json"), ("a = [", ".toml"), ("a: [", ".yaml")]:
        with pytest.raises(TopologyError) as info:
            loads(text, suffix)
        assert "\n" not in str(info.value)


@settings(max_examples=int(os.environ.get("GRADSYNC_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(
                        ["name", "nodes", "links", "workers", "host", "a", "b", "kind", "bandwidth",
                         "latency", "rings", "duplex"]), kids, max_size=5), max_leaves=20))
def test_fuzzed_topologies_load_or_raise_topology_error(data):
    try:
        from_dict(data)
    except TopologyError as exc:
        assert "\n" not in str(exc)


def test_node_costs_load_from_a_file_with_units_and_bad_values_are_named():
    from gradsync.model.topology import from_dict
    base = {"links": [{"a": "a", "b": "b", "bandwidth": "10GB/s"}], "workers": ["a", "b"]}
    t = from_dict({**base, "nodes": [{"name": "a", "kind": "host", "copy_rate": "2GB/s", "message_overhead": "20us",
                                      "fan_in": 0.5}, {"name": "b", "kind": "host"}]})
    a, b = t.nodes
    assert (a.copy_rate, a.fan_in) == (2e9, 0.5) and a.message_overhead == pytest.approx(20e-6)
    assert (b.copy_rate, b.message_overhead, b.fan_in) == (None, None, None)
    with pytest.raises(TopologyError, match="nodes.0.fan_in"):
        from_dict({**base, "nodes": [{"name": "a", "kind": "host", "fan_in": -1}, {"name": "b", "kind": "host"}]})
    with pytest.raises(TopologyError, match="nodes.0.copy_rate"):
        from_dict({**base, "nodes": [{"name": "a", "kind": "host", "copy_rate": "fast"}, {"name": "b", "kind": "host"}]})
