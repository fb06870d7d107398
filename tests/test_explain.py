"""gradsync explain: each candidate's terms add up to its predicted time, and each term is its
alpha-beta-gamma formula read off the topology."""

import json
import subprocess
import sys

import pytest

from gradsync.model.explain import explain
from gradsync.model.topology import preset
from gradsync.model.tune import choose

LINEAR = ["central", "sharded", "ring", "halving_doubling"]


@pytest.mark.parametrize("workers, nbytes", [(8, 64_000_000), (5, 4096), (7, 1_000_000)])
def test_terms_add_up_to_the_simulated_time_on_one_switch(workers, nbytes):
    topo = preset("ethernet", workers)
    out = explain(topo, nbytes, max_error=1e-2)
    for row in out["candidates"]:
        total = sum(row[k] for k in ("latency", "bandwidth", "reduction", "codec"))
        assert total == pytest.approx(row["closed_form"], rel=1e-12)
        if row["algorithm"] == "tree" and (workers + 1) & workers:
            continue            # an incomplete tree's closed form is an upper bound (test_simulate)
        assert total == pytest.approx(row["predicted_s"], rel=0.01), row["candidate"]
    times = {r["candidate"]: r["predicted_s"] for r in out["candidates"]}
    ranked = sorted(times, key=times.get)
    assert out["winner"] == ranked[0] == choose(topo, nbytes, max_error=1e-2).label
    assert out["margin"] == pytest.approx(times[ranked[1]] / times[ranked[0]] - 1)


def test_each_term_is_its_formula_with_the_topology_parameters():
    workers, nbytes, itemsize = 6, 6_000_000, 4
    topo = preset("ethernet", workers)
    alpha, beta = topo.path_alpha_beta(topo.workers[0], topo.workers[1])
    gamma, mu = 1 / topo.reduce_rate(topo.workers[0]), 1 / topo.madd_rate(topo.workers[0])
    rows = {r["candidate"]: r for r in explain(topo, nbytes, candidates=LINEAR + ["cerar"])["candidates"]}
    ring, sharded, cerar = rows["ring"], rows["sharded"], rows["cerar"]
    n = workers
    assert ring["latency"] == pytest.approx(2 * (n - 1) * alpha)
    assert ring["bandwidth"] == pytest.approx(2 * (n - 1) / n * nbytes * beta)
    assert ring["reduction"] == pytest.approx((n - 1) / n * nbytes / itemsize * gamma)
    assert ring["codec"] == 0 and sharded["latency"] == pytest.approx(2 * alpha)
    c = 2 * n                                            # CERAR's default components; m elements per component
    m = -(-nbytes // itemsize // c)
    assert cerar["codec"] == pytest.approx((c + n - 2) * c * m * mu + 2 * c * c * m * mu)
    # the bottleneck of a bandwidth-bound ring is a worker's uplink, busy most of the time
    assert ring["bottleneck"].endswith("->switch") and ring["bottleneck_busy"] > 0.8


def test_cli_explains_and_sets_measured_times_beside(tmp_path):
    rows = [{"algorithm": "ring", "bytes": 4000, "time_s": 0.002}, {"algorithm": "ring", "bytes": 4000, "time_s": 0.004}]
    (tmp_path / "bench.json").write_text(json.dumps(rows))
    run = subprocess.run([sys.executable, "-m", "gradsync", "explain", "-t", "ethernet", "-n", "4", "-s", "4KB",
                          "--algorithms", "ring,tree", "--measured", str(tmp_path / "bench.json"), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    by = {r["candidate"]: r for r in out["candidates"]}
    assert by["ring"]["measured_s"] == pytest.approx(0.003) and by["tree"]["measured_s"] is None
    (tmp_path / "bad.json").write_text("{}")
    bad = subprocess.run([sys.executable, "-m", "gradsync", "explain", "--measured", str(tmp_path / "bad.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "is not the output of 'gradsync bench --format json'" in bad.stderr
    assert bad.stderr.count("\n") == 1
