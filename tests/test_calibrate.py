"""Calibration's fitting, on measurements made up from known costs (no processes started)."""

import pytest

from gradsync import algorithms
from gradsync.tools import calibrate
from gradsync.model.simulate import simulate
from gradsync.model.topology import from_dict

N, ALPHA, BANDWIDTH, ONE_WAY = 4, 400e-6, 1e9, 2e9


def launch(pairs_rate, checked=5e-3, unchecked=3e-3):
    """One launch's measurements: a ring with ALPHA per round and BANDWIDTH per direction, k
    senders into one at ONE_WAY in total, an exchange at half of it each way, and two disjoint
    pairs at ``pairs_rate`` each."""
    sizes = list(calibrate.FIT_BYTES)
    ring = [2 * (N - 1) * ALPHA + 2 * (N - 1) / N * n / BANDWIDTH for n in sizes]
    p2p = calibrate.P2P_BYTES
    return {"sizes": sizes, "times": ring, "add_rate": 1e18, "madd_rate": 1e9,
            "agreement_s": [checked, unchecked],
            "fan_in_s": {f"{k}x{n}": 50e-6 + k * n / ONE_WAY for k in range(1, N) for n in p2p},
            "exchange_s": {str(n): 50e-6 + 2 * n / ONE_WAY for n in p2p},
            "pairs_s": {str(n): 50e-6 + n / pairs_rate for n in p2p}}


def test_the_ring_sets_overhead_and_bandwidth_and_the_agreement_its_own_cost():
    fit = calibrate.fit_launches(N, [launch(ONE_WAY, 5e-3, 3e-3), launch(ONE_WAY, 6e-3, 3e-3), launch(ONE_WAY, 4e-3, 3e-3)])
    assert fit["round_latency_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["bandwidth_Bps"] == pytest.approx(BANDWIDTH, rel=1e-6)
    node = fit["node"]
    assert node["collective_overhead_s"] == pytest.approx(2e-3)        # medians: 5 ms checked, 3 ms not
    # a ring round: the latency, one send and one receive, and the runtime's own cost per round
    assert node["latency_s"] + 2 * node["message_overhead_s"] + node["round_overhead_s"] == pytest.approx(ALPHA, rel=1e-6)


def test_processes_and_the_machine_each_get_their_copy_rate():
    node = calibrate.fit_launches(N, [launch(ONE_WAY / 2)])["node"]
    assert node["pairs_over_one_way"] == pytest.approx(1.0, rel=1e-6)      # two pairs moved what one does
    assert node["copy_rate_Bps"] == pytest.approx(ONE_WAY, rel=1e-6)         # a fan-in's total: each process's limit
    assert node["machine_copy_rate_Bps"] == pytest.approx(N * BANDWIDTH, rel=1e-6)    # a ring round moves n in all
    topo = calibrate.topology_dict(calibrate.fit_launches(N, [launch(ONE_WAY / 2)]))
    switch = next(n for n in topo["nodes"] if n["name"] == "switch")
    assert switch["copy_rate"] == pytest.approx(N * BANDWIDTH, rel=1e-6)
    # the exchange moved half of one way each way: half duplex, so the nodes' copy channels limit
    assert all(n["copy_rate"] == pytest.approx(ONE_WAY, rel=1e-6) for n in topo["nodes"] if n["name"].startswith("worker"))


def test_a_fan_in_runs_at_the_processes_rate_and_the_ring_at_the_machines():
    fit = calibrate.fit_launches(N, [launch(ONE_WAY / 2)])
    topo = from_dict(calibrate.topology_dict(fit))
    fan = simulate(algorithms.build("central", N, 16 << 20), topo)
    # central: 3 x 64 MB into worker 0 and back out, each way through its copy channel at ONE_WAY
    # (half duplex: its sends and receives take turns, one round each); the machine allows 4 GB/s
    assert fan.time == pytest.approx(2 * 3 * (64 << 20) / ONE_WAY, rel=0.05)


def test_the_written_topology_times_the_ring_it_was_fitted_to_and_runs_the_host_in_worker0():
    fit = calibrate.fit_launches(N, [launch(ONE_WAY / 2)])
    topo = from_dict(calibrate.topology_dict(fit))
    assert topo.route_nodes("ps", "worker1") == [topo.index[n] for n in ("ps", "worker0", "switch", "worker1")]
    assert all(n.collective_overhead == pytest.approx(2e-3) for n in topo.nodes if n.kind != "switch")
    for n, measured in zip(fit["fit_sizes"], fit["fit_times_s"]):
        predicted = simulate(algorithms.build("ring", N, int(n) // 4), topo).time
        # the collective's agreement comes on top of the ring the fit saw; the rest is the fit
        assert predicted - 2e-3 == pytest.approx(measured, rel=0.02), n


def test_sizes_on_slow_links_stop_at_half_a_second_of_the_link():
    cap = calibrate.link_max_bytes(12.5e6)
    sizes = calibrate.sizes_for(calibrate.FIT_BYTES, cap)
    assert max(sizes) <= cap < min(n for n in calibrate.FIT_BYTES if n not in sizes)


def test_ranks_slower_all_at_once_than_alone_share_the_machine_cores():
    runs = [{**launch(ONE_WAY / 2), "add_rate": 5e8, "add_rate_alone": 1e9}]    # 4 ranks on 2 cores
    fit = calibrate.fit_launches(N, runs)
    assert fit["cores"] == pytest.approx(2.0)
    topo = calibrate.topology_dict(fit)
    switch = next(n for n in topo["nodes"] if n["name"] == "switch")
    workers = [n for n in topo["nodes"] if n["name"].startswith("worker")]
    assert switch["cores"] == pytest.approx(2.0)
    assert all(w["reduce_rate"] == pytest.approx(1e9) and w["madd_rate"] == pytest.approx(2e9) for w in workers)
    # as fast alone as together: no cores written, the rates as measured
    fit = calibrate.fit_launches(N, [{**launch(ONE_WAY / 2), "add_rate": 1e9, "add_rate_alone": 1e9}])
    assert "cores" not in next(n for n in calibrate.topology_dict(fit)["nodes"] if n["name"] == "switch")
