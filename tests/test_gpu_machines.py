"""GPU machines in the model: NCCL's link efficiencies and protocols, posted sends, lanes as
independent tracks, switches that reduce, no peer-to-peer; and the new algorithms (NCCL's
ring, tree, NVLS, NVLS-tree, PAT) timed against hand-worked figures and their closed forms."""

import json

import numpy as np
import pytest

from gradsync import algorithms, emulate, verify
from gradsync.algorithms import _compact, nccl_ring, nccl_tree, nvls, nvls_tree, pat
from gradsync.errors import ConfigError
from gradsync.model.cost import net_for, predict, runnable
from gradsync.model.simulate import scalar, simulate
from gradsync.model.topology import preset, resolve
from gradsync.model.topology.gpu import LINK_KINDS, PROTOCOLS

US = 1e-6


def test_links_deliver_what_nccls_topology_constants_say():
    # NCCL's topo.h: 20.6 GB/s per NVLink 4 link, 20 per NVLink 3, 12 per PCIe Gen3 x16, 12 per 100 Gbit/s
    assert preset("hgx-h100").channel_capacity[0] == pytest.approx(18 * 20.6e9)
    assert preset("hgx-a100").channel_capacity[0] == pytest.approx(12 * 20.0e9)
    assert LINK_KINDS["pcie"].efficiency * 15.75 == pytest.approx(12.0)
    assert LINK_KINDS["net"].efficiency * 12.5 == pytest.approx(12.0)


def test_a_ring_step_costs_the_protocols_latency_and_its_bytes_at_the_protocols_efficiency():
    topo = preset("hgx-h100", 2)
    for name, protocol in PROTOCOLS.items():
        nbytes = 2 << 20
        t = simulate(algorithms.build("ring", 2, nbytes // 4), topo, protocol=name).time
        # 2 steps of half the buffer, each its step latency; the collective's own latency once;
        # LL at most NCCL's llMaxBw for Hopper on one machine, 141 GB/s of payload each way
        rate = protocol.efficiency * 18 * 20.6e9 if name != "ll" else min(0.5 * 18 * 20.6e9, 141e9)
        step = protocol.step_latency("nvlink") + nbytes / 2 / rate
        assert t == pytest.approx(protocol.base + 2 * step, rel=1e-9)


def test_a_protocol_is_refused_where_the_topology_has_no_gpus_or_does_not_offer_it():
    with pytest.raises(ConfigError, match="not a GPU machine"):
        simulate(algorithms.build("ring", 4, 100), preset("ethernet", 4), protocol="ll")
    with pytest.raises(ConfigError, match="ll128"):
        simulate(algorithms.build("ring", 2, 100), preset("pcie-server", 2), protocol="ll128")


@pytest.mark.parametrize("name,workers", [("hgx-h100", 8), ("dgx-1", 8), ("nvlink-pair", 2), ("pcie-server", 4)])
def test_numpy_and_scalar_loops_agree_bit_for_bit_with_posted_sends(name, workers, monkeypatch):
    topo = preset(name, workers)
    for algorithm in ("ring", "tree", "nccl_tree", "pat", "sharded"):
        s = algorithms.build(algorithm, workers, 40_000)
        small = simulate(s, topo, symmetry=False)
        monkeypatch.setattr(scalar, "SMALL_ROUNDS", 0)
        numpy = simulate(s, topo, symmetry=False)
        monkeypatch.undo()
        assert np.array_equal(small.flow_times, numpy.flow_times, equal_nan=True), algorithm
        assert np.array_equal(small.node_done, numpy.node_done), algorithm


@pytest.mark.parametrize("machines", [2, 3])
def test_rail_rings_compact_form_times_every_transfer_as_the_full_simulation(machines):
    topo = preset("cluster", machines=machines, gpus=4, gpu="h100")
    n = 4 * machines
    for elements in (n * 64, n * 64 + 5):
        c = nccl_ring.compact(n, elements, local_size=4)
        fast = simulate(c, topo)
        full = simulate(c.expand(), topo, symmetry=False)
        assert fast.time == full.time and np.array_equal(fast.start, full.start)
        assert np.array_equal(np.sort(c.expand().lane), np.sort(nccl_ring.schedule(n, elements, local_size=4).lane))


def test_channels_run_apart_so_a_ring_pays_only_its_own_network_hops():
    # 2 machines x 8 GPUs, 8 rings: each ring crosses the network twice per lap of 16 hops, so its
    # 30 steps (a chunk's path, 30 hops in a row) cross it 4 times at most; coupling the rings'
    # rounds would make every step wait for some other ring's network hop (30 x 14 us)
    topo = preset("cluster", machines=2, gpu="h100")
    t = simulate(nccl_ring.compact(16, 4096, local_size=8), topo).time
    simple = PROTOCOLS["simple"]
    path = simple.base + 26 * simple.step_latency("nvlink") + 4 * simple.step_latency("net")
    assert t == pytest.approx(path, rel=1e-3)                # 32 bytes a chunk: latency alone


def test_the_trees_root_broadcasts_a_segment_only_after_reducing_it():
    # up and down are lanes of their own; the root holds its broadcast for the reduce (a dependency
    # across lanes): with one segment, up the chain then down it, 2 (N - 1) steps in a row
    topo = preset("hgx-h100", 4)
    t = simulate(nccl_tree.schedule(4, 64, segments=1), topo).time
    simple = PROTOCOLS["simple"]
    assert t == pytest.approx(simple.base + 6 * simple.step_latency("nvlink"), rel=1e-3)


def test_nvls_moves_each_byte_once_each_way_plus_a_piece_at_the_switchs_share():
    # ld_reduce through the switch, the sum to its owner, multimem.st back, multicast: per GPU link
    # n (1 + 1/N) each way at 0.85 of it (NCCL's nvlsEfficiency, Hopper)
    topo = preset("hgx-h100")
    n = 4 << 30
    t = simulate(nvls.schedule(8, n // 4, segments=256), topo).time
    ideal = n * (1 + 1 / 8) / (18 * 20.6e9 * 0.85)
    # within a lane a GPU's rounds wait for each other: one step latency (3.4 us) per round of 60 us
    assert ideal < t < ideal * 1.08


def test_nvls_needs_a_switch_that_reduces_and_says_which_is_missing():
    assert runnable("nvls", preset("hgx-h100"), 8) is None
    assert "NVLink SHARP" in runnable("nvls", preset("hgx-a100"), 8)
    assert runnable("nvls_tree", preset("cluster", gpu="h100"), 16) is None
    assert "needs a switch" in runnable("nvls_tree", preset("cluster", gpu="a100"), 16)
    with pytest.raises(ConfigError, match="switch that reduces"):
        simulate(nvls.schedule(8, 64), preset("hgx-a100"))


def test_without_peer_to_peer_every_transfer_goes_through_host_memory():
    topo = preset("pcie-server", gpus=2, per_switch=2, gen=3)
    assert [topo.nodes[i].name for i in topo.route_nodes("gpu0", "gpu1")] == ["gpu0", "plx0", "cpu0", "plx0", "gpu1"]
    with_p2p = preset("pcie-server", gpus=2, per_switch=2, gen=3, p2p=True)
    slow = simulate(algorithms.build("ring", 2, 1 << 28), topo).time
    fast = simulate(algorithms.build("ring", 2, 1 << 28), with_p2p).time
    assert slow / fast == pytest.approx(2.0, rel=0.01)        # both directions share the switch's one uplink


@pytest.mark.parametrize("algorithm", ["nccl_ring", "nccl_tree", "nvls", "nvls_tree", "pat"])
def test_the_new_algorithms_sum_exactly_on_machines_of_several_gpus(algorithm, rng):
    for workers, local in ((8, 4), (12, 3), (6, 6)):
        options = {"local_size": local} if "local_size" in algorithms.get(algorithm).options else {}
        for elements in (0, 1, 37, 1000):
            s = algorithms.build(algorithm, workers, elements, **options)
            verify(s)
            inputs = rng.standard_normal((workers, elements))
            out = emulate(s, inputs)
            np.testing.assert_allclose(out, np.broadcast_to(inputs.sum(axis=0), out.shape), rtol=1e-12, atol=1e-12)


def test_pat_compact_form_is_its_table_and_takes_log_many_rounds():
    for n in (2, 5, 8, 13):
        c = pat.compact(n, n * 10)
        assert sorted(c.expand().transfers.tolist()) == sorted(pat.schedule(n, n * 10).transfers.tolist())
        assert c.rounds == 2 * (n - 1).bit_length()


def test_gpu_closed_forms_charge_the_protocol_and_match_the_ring_simulation():
    topo = preset("hgx-h100")
    n = net_for(topo, 8, protocol="ll")
    assert n.alpha == pytest.approx(0.6 * US) and n.base == pytest.approx(6.6 * US)
    for protocol in ("ll", "ll128", "simple"):
        sim = simulate(algorithms.build("ring", 8, 1 << 26), topo, protocol=protocol).time
        assert predict("ring", topo, 8, 1 << 28, protocol=protocol) == pytest.approx(sim, rel=0.01)


def test_cluster_takes_any_gpu_count_per_nvlink_domain():
    t = resolve("cluster:machines=2,gpus=72,gpu=b200")
    assert len(t.workers) == 144 and t.reducers == ("m0nvs", "m1nvs")
    c = _compact.build("nccl_ring", 144, 144 * 100, local_size=72)
    assert simulate(c, t).strides == (1, 1)


def cli(*args):
    from click.testing import CliRunner
    from gradsync.cli import main
    return CliRunner().invoke(main, list(args))


def test_compare_and_explain_on_a_cluster_leave_out_what_it_cannot_run_and_say_so_once():
    run = cli("compare", "-t", "cluster:machines=2,gpus=4", "-s", "1MB", "--algorithms",
              "ring,sharded,nccl_ring")
    assert run.exit_code == 0, run.output
    run = cli("compare", "-t", "cluster:machines=2,gpus=4", "-s", "1MB", "--format", "json")
    assert run.exit_code == 0, run.output
    assert "host" not in {r["algorithm"] for r in json.loads(run.stdout)}
    assert run.stderr.count("needs a host node") == 1
    run = cli("compare", "-t", "cluster:machines=2,gpus=4", "-s", "1MB", "--algorithms", "host")
    assert run.exit_code == 2 and "needs a host node" in run.output
    run = cli("explain", "-t", "cluster:machines=2,gpus=4", "-s", "1MB")
    assert run.exit_code == 0 and run.output.count("left out: algorithm 'host'") == 1


def test_tune_on_a_gpu_machine_names_protocols_and_what_nccl_would_run():
    run = cli("tune", "-t", "hgx-h100", "--min-size", "4KB", "--max-size", "64MB", "--format", "json")
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    assert all("/" in label for label in out["rows"][0]["times_s"])          # algorithm/protocol
    assert {r["nccl"]["protocol"] for r in out["rows"]} <= {"ll", "ll128", "simple"}
    assert out["rows"][0]["nccl"]["algorithm"] == "nccl_ring"                # small: NCCL's ring, LL
    assert out["rows"][-1]["nccl"]["algorithm"] == "nvls"                    # large: NVLink SHARP


def test_simulate_takes_a_protocol_on_gpu_machines_only():
    assert cli("simulate", "-a", "ring", "-t", "hgx-h100", "-s", "1MB", "--protocol", "ll").exit_code == 0
    run = cli("simulate", "-a", "ring", "-t", "ethernet", "-s", "1MB", "--protocol", "ll")
    assert run.exit_code == 2 and "not a GPU machine" in run.output
