"""The live view: its JSON API (4xx, never 5xx, on bad input) and the page in headless Chromium."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradsync.web.app import create_app

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def test_simulate_returns_the_simulators_numbers(client):
    r = client.post("/api/simulate", json={"algorithm": "sharded", "topology": "pcie-switch-4", "workers": 4,
                                           "size": "160MB"})
    assert r.status_code == 200
    d = r.json()
    assert d["time_s"] == pytest.approx(0.015, rel=1e-3)
    t = d["transfers"]
    assert len(t["src"]) == 2 * 4 * 3 and max(t["done"]) == pytest.approx(d["time_s"])
    assert t["carried"][:12] == [1] * 12 and t["carried"][12:] == [4] * 12   # partial, then full sums


def test_failure_stops_the_failed_devices_peers(client):
    d = client.post("/api/simulate", json={"algorithm": "ring", "workers": 6, "fail": {"device": 2, "at": 0.3}}).json()
    f = d["failure"]
    assert f["device"] == 2 and not all(f["completed"])
    assert {s["node"] for s in f["stopped"]} == set(range(6))                 # a ring: everyone waits on it
    assert all("rank 2" in s["message"] for s in f["stopped"] if s["node"] != 2)


def test_compare_curve_passes_through_the_seed_figures(client):
    c = client.get("/api/compare?size=160MB").json()
    k = c["workers"].index(4)
    for mark in c["seed_marks"]:
        assert c["curves"][mark["algorithm"]]["simulated_s"][k] == pytest.approx(mark["time_s"], rel=1e-3)


@pytest.mark.parametrize("body", [
    {"workers": 65}, {"workers": 1}, {"algorithm": "magic"}, {"size": "lots"}, {"size": "100GB"},
    {"bandwidth": "fast"}, {"latency": "-3"}, {"components": 0}, {"eps": 2}, {"fail": {"device": 9, "at": 0.5}},
    {"colour": "red"}, {"topology": "moon"},
])
def test_bad_requests_are_4xx_with_a_message(client, body):
    r = client.post("/api/simulate", json=body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert "detail" in r.json()


def test_work_per_request_is_bounded(client, monkeypatch):
    from gradsync.web import view
    monkeypatch.setattr(view, "MAX_TRANSFERS", 100)
    r = client.post("/api/simulate", json={"algorithm": "sharded", "workers": 64})
    assert r.status_code == 400 and "at most 100" in r.json()["detail"]


def test_oversized_and_malformed_bodies_are_refused(client):
    assert client.post("/api/simulate", content=b"{" * 100_000, headers={"content-type": "application/json"}).status_code == 413
    assert client.post("/api/simulate", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    assert client.get("/static/../../etc/passwd").status_code == 404


def test_schedule_endpoint_serves_the_largest_schedule_and_refuses_beyond_the_bound(client, monkeypatch):
    # sharded on 64 workers is 2 x 64 x 63 = 8064 transfers (any element count): within MAX_TRANSFERS, so 200
    url = "/api/schedule?algorithm=sharded&workers=64&elements=10000000"
    r = client.get(url)
    assert r.status_code == 200 and len(r.json()["transfers"]["src"]) == 2 * 64 * 63
    from gradsync.web import view
    monkeypatch.setattr(view, "MAX_TRANSFERS", 8063)
    r = client.get(url)
    assert r.status_code == 400 and "8064 transfers: at most 8063" in r.json()["detail"]


_values = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3))
_bodies = st.fixed_dictionaries({}, optional={k: _values for k in (
    "algorithm", "topology", "workers", "size", "bandwidth", "latency", "components", "eps", "fail")}) | _values


@settings(max_examples=int(os.environ.get("GRADSYNC_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=_bodies, small=st.sampled_from(["ring", "tree", "sharded", "host", "cerar"]))
def test_fuzzed_requests_never_cause_a_server_error(client, body, small):
    if isinstance(body, dict) and "algorithm" not in body:
        body = {**body, "algorithm": small}
    r = client.post("/api/simulate", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.text)


# ---- the page, in headless Chromium ---------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gradsync", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    page = browser.new_page(viewport={"width": 1300, "height": 1250})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server)
    page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0")
    page.errors = errors
    yield page
    page.close()


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def test_page_loads_without_errors_and_animates(page):
    first = page.evaluate("window.gradsyncStats.frames")
    now1 = page.text_content("#now")
    page.wait_for_timeout(700)
    assert page.evaluate("window.gradsyncStats.frames") > first
    assert page.text_content("#now") != now1
    shot(page, "loaded")
    assert page.errors == []


def test_time_shown_is_the_apis(page, server):
    import urllib.request
    req = urllib.request.Request(server + "api/simulate", data=json.dumps({"algorithm": "ring", "topology": "ring",
                                 "workers": 8, "size": "160MB"}).encode(), headers={"content-type": "application/json"})
    api = json.loads(urllib.request.urlopen(req).read())
    assert float(page.get_attribute("#total-time", "data-time-s")) == api["time_s"]


def test_changing_workers_mid_run_redraws_with_that_many_devices(page):
    for n in (16, 64):
        page.fill("#workers", str(n))
        page.dispatch_event("#workers", "change")
        page.wait_for_function(f"window.gradsyncStats.drawnWorkers === {n}")
        assert f"{n} workers" in page.text_content("#summary")
        assert page.evaluate("window.gradsyncStats.updateMs") is not None   # speed: benchmarks/web_view.py
        shot(page, f"workers{n}")
    assert page.errors == []


def test_fail_control_shows_the_failure(page):
    page.fill("#fail-device", "2")
    page.click("#fail")
    page.wait_for_function("document.querySelector('#numbers').textContent.includes('failure')")
    assert "rank 2" in page.text_content("#numbers")
    page.wait_for_timeout(1500)
    shot(page, "failed")
    page.click("#heal")
    page.wait_for_function("!document.querySelector('#numbers').textContent.includes('failure')")
    assert page.errors == []


def test_every_algorithm_and_topology_draws(page):
    for topology in ("pcie-switch-4", "p3.16xlarge", "lowbw-cluster"):
        page.select_option("#topology", topology)
        for algorithm in ("central", "host", "sharded", "ring", "tree", "halving_doubling", "cerar"):
            page.select_option("#algorithm", algorithm)
            page.wait_for_function(f"document.querySelector('#summary').textContent.startsWith('{algorithm}') && "
                                   f"document.querySelector('#summary').textContent.includes('on {topology}')")
        shot(page, f"topology-{topology}")
    assert page.errors == [] and page.text_content("#status") == ""
