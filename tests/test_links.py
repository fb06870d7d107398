"""Slow-link emulation with network namespaces and tc (root only; skipped otherwise)."""

import os
import subprocess

import pytest

import runtime_bodies as bodies
from gradsync import ConfigError
from gradsync.tools import links
from gradsync.tools.launch import run

root_only = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/ip"),
                               reason="needs root and iproute2")


def namespaces():
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_without_root_the_error_is_clear(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root"):
        with links.SlowLinks(2, "100Mbit"):
            pass


@root_only
def test_namespaces_are_created_and_removed_even_after_an_error():
    before = namespaces()
    with pytest.raises(RuntimeError):
        with links.SlowLinks(3, "1Gbit") as net:
            created = {net.switch, *net.namespaces}
            assert len(created) == 4 and created <= namespaces()
            raise RuntimeError("boom")
    # ours are gone and nothing new is left; entering may also have removed the leftovers of
    # a dead process (by design), so the list can be shorter than before, never longer
    assert not created & namespaces()
    assert namespaces() <= before


@root_only
def test_leftovers_of_a_dead_process_are_removed():
    subprocess.run(["ip", "netns", "add", "gs999999-w0"], check=True)
    with links.SlowLinks(2, "1Gbit"):
        assert "gs999999-w0" not in namespaces()
    assert "gs999999-w0" not in namespaces()


@root_only
def test_latency_without_netem_is_a_clear_error():
    if links.has_netem():
        pytest.skip("this kernel has netem")
    with pytest.raises(ConfigError, match="netem"):
        with links.SlowLinks(2, "100Mbit", latency="5ms"):
            pass


@root_only
def test_shaped_links_carry_close_to_their_limit():
    with links.SlowLinks(2, "100Mbit") as net:
        seconds = run(bodies.timed_ring, 2, 1 << 20, network=net)[0]
    busbw = 4 * (1 << 20) / seconds * 2 * 1 / 2          # bytes/s, N = 2
    assert 0.5 * 12.5e6 <= busbw <= 1.1 * 12.5e6, busbw    # shaped: near the limit, never above it


@root_only
def test_idle_slow_start_is_the_kernel_default_unless_turned_off():
    def setting(ns):
        return subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle"],
                              capture_output=True, text=True, check=True).stdout.strip()

    with links.SlowLinks(2, "1Gbit") as net:
        assert [setting(ns) for ns in net.namespaces] == ["1", "1"]
    with links.SlowLinks(2, "1Gbit", idle_slow_start=False) as net:
        assert [setting(ns) for ns in net.namespaces] == ["0", "0"]



def _rates(net, machine):
    """The tbf rate on machine's interface and on its switch port, as tc shows them."""
    tag = net.namespaces[0].split("-")[0]
    shown = [subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
                            capture_output=True, text=True, check=True).stdout
             for ns, dev in ((net.namespaces[machine], net.interface), (f"{tag}-sw", f"{tag}v{machine}b"))]
    return [s.split(" rate ")[1].split()[0] for s in shown]


@root_only
def test_one_machine_can_be_slowed_both_ways():
    with links.SlowLinks(3, "100Mbit") as net:
        with pytest.raises(ConfigError, match="machine must be an integer in 0..2, got 3"):
            net.set_rate(3, "25Mbit")
        net.set_rate(1, "25Mbit")
        assert _rates(net, 1) == ["25Mbit", "25Mbit"]
        assert _rates(net, 0) == _rates(net, 2) == ["100Mbit", "100Mbit"]


@pytest.mark.slow
@root_only
def test_a_slow_machine_slows_the_ring_to_its_rate():
    with links.SlowLinks(2, "100Mbit") as net:
        net.set_rate(1, "25Mbit")
        seconds = run(bodies.timed_ring, 2, 1 << 20, network=net)[0]
    busbw = 4 * (1 << 20) / seconds              # N = 2: each worker sends the buffer once
    assert 0.5 * 3.125e6 <= busbw <= 1.1 * 3.125e6, busbw    # the slow link's rate, not the others'


@pytest.mark.slow
@root_only
def test_calibrate_on_slow_links_measures_the_links_and_writes_them(tmp_path):
    from gradsync.tools import calibrate
    from gradsync.model.topology import load

    with links.SlowLinks(2, "100Mbit") as net:
        fit = calibrate.calibrate(2, repeats=3, launches=1, network=net)
    node, rate = fit["node"], 12.5e6
    assert max(fit["fit_sizes"]) <= calibrate.link_max_bytes(rate)         # no minute-long messages
    assert 0.5 * rate <= node["one_way_Bps"] <= 1.1 * rate, node["one_way_Bps"]
    # both ends are shaped apart: an exchange gets the link's rate each way (full duplex)
    assert node["duplex"] == "full" and node["exchange_Bps_per_direction"] >= 0.75 * node["one_way_Bps"]
    path = calibrate.write(fit, tmp_path / "c.json")
    topo = load(str(path))
    worker_links = [l.bandwidth for l in topo.links if l.a.startswith("worker")]
    assert all(0.5 * rate <= bw <= 1.2 * rate for bw in worker_links), worker_links
    assert "100 Mbit/s links" in topo.description
