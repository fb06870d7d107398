"""The live view: its JSON API (4xx, never 5xx, on bad input) and the page in headless Chromium."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradsync.web.app import create_app

ARTIFACTS = Path(__file__).parent / "artifacts"


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def _eventually(call, *args, **kwargs):
    """A request, asked again while the server answers 202 (still computing in the background)."""
    for _ in range(120):
        r = call(*args, **kwargs)
        if r.status_code != 202:
            return r
        time.sleep(0.25)
    raise AssertionError("still computing after 30 s")


def test_simulate_returns_the_simulators_numbers(client):
    r = _eventually(client.post, "/api/simulate", json={"algorithm": "sharded", "topology": "pcie-switch-4", "workers": 4,
                                           "size": "160MB"})
    assert r.status_code == 200
    d = r.json()
    assert d["time_s"] == pytest.approx(0.015, rel=1e-3)
    t = d["transfers"]
    assert len(t["src"]) == 2 * 4 * 3 and max(t["done"]) == pytest.approx(d["time_s"])
    assert t["carried"][:12] == [1] * 12 and t["carried"][12:] == [4] * 12   # partial, then full sums


def test_compressed_packets_carry_the_codecs_bytes(client):
    def sim(compression=None):
        body = {"algorithm": "ring", "topology": "ethernet", "workers": 4, "size": "16MB", "bandwidth": "100Mbit"}
        r = _eventually(client.post, "/api/simulate", json=body | ({"compression": compression} if compression else {}))
        assert r.status_code == 200, r.text
        return r.json()

    exact, fp16, power, topk = sim(), sim("fp16"), sim("powersgd:rank=1"), sim("topk:ratio=0.01")
    assert exact["compression"] is None
    # fp16: the same ring, every packet half as large; the wire dominates at 100 Mbit/s
    assert fp16["transfers"]["count"] == exact["transfers"]["count"] and fp16["compression"]["itemsize"] == 2
    assert fp16["compression"]["wire_bytes"] == 2 * 3 / 4 * 16e6 / 2
    assert fp16["time_s"] == pytest.approx(exact["time_s"] / 2, rel=0.01)
    # PowerSGD r = 1 on one 2000 x 2000 matrix: a ring all-reduce of P (2000 floats), then one of Q
    assert power["rounds"] == 12 and power["compression"]["wire_bytes"] == 2 * (2 * 3 / 4 * 2000 * 4)
    # top-k 1%: an all-gather (3 rounds) of 40,000 (value, index) pairs per worker
    assert topk["rounds"] == 3 and sum(topk["transfers"]["count"]) == 4 * 3 * 2 * 40_000
    # fp16 packets over CERAR: its float16 error shown, and over gradsync's bound (refused by default)
    coded = _eventually(client.post, "/api/simulate", json={"algorithm": "cerar", "workers": 4, "size": "1MB",
                                                             "compression": "fp16"}).json()
    assert coded["compression"]["itemsize"] == 2 and coded["estimate"]["refused"] and coded["estimate"]["error"] > 0.01
    bad = client.post("/api/simulate", json={"algorithm": "ring", "compression": "topk:ratio=2"})
    assert 400 <= bad.status_code < 500 and "ratio" in bad.text


def test_failure_stops_the_failed_devices_peers(client):
    d = _eventually(client.post, "/api/simulate", json={"algorithm": "ring", "workers": 6, "fail": {"device": 2, "at": 0.3}}).json()
    f = d["failure"]
    assert f["device"] == 2 and not all(f["completed"])
    assert {s["node"] for s in f["stopped"]} == set(range(6))                 # a ring: everyone waits on it
    assert all("rank 2" in s["message"] for s in f["stopped"] if s["node"] != 2)


# ---- failures, with the runtime's detection delay (gradsync.web.failures) ---------------------------

def _ring4():
    """A hand-made ring of 4 (i sends to i + 1 in each of 6 rounds): round r runs from r to
    r + 1 seconds, except in round 1 where 0 -> 1 starts at 1.25 and 3 -> 0 runs from 1.5 to 5."""
    t = {"src": [], "dst": [], "round": [], "start": [], "done": []}
    for r in range(6):
        for i in range(4):
            start, done = {(1, 0): (1.25, 2.0), (1, 3): (1.5, 5.0)}.get((r, i), (float(r), r + 1.0))
            for key, v in (("src", i), ("dst", (i + 1) % 4), ("round", r), ("start", start), ("done", done)):
                t[key].append(v)
    return t


def _stops(f):
    return {s["node"]: (s["at_s"], s["waited_for"]) for s in f["stopped"]}


def test_a_crash_is_found_at_each_survivors_next_liveness_check():
    from gradsync.web.failures import failure
    # rank 2 dies at 1.5 s, in round 1; liveness checks every 1.5 s from when each began waiting.
    # Ranks 1 and 3 wait for it from 1.0: their checks at 2.5 find it. Rank 0 received from 3
    # until 3 stopped at 2.5 (a transfer that would have lasted to 5), so its check at
    # 1.25 + 1.5 = 2.75 finds it, from the record. 0 -> 1 of round 1 lands at 2.0, before both stop.
    f = failure(_ring4(), device=2, at=1.5, detection="crash", check_every_s=1.5)
    assert _stops(f) == {0: (2.75, 3), 1: (2.5, 2), 2: (1.5, None), 3: (2.5, 2)}
    assert sum(f["completed"]) == 5 and f["completed"][4] and not f["completed"][7]
    by = {s["node"]: s for s in f["stopped"]}
    assert all(s["died_s"] == 1.5 for s in f["stopped"])
    assert by[1]["message"] == ("PeerError: rank 2 died (its process is gone), seen at this rank's next liveness "
                                "check while this rank waited to send to rank 2")
    assert "once rank 3 had stopped" in by[0]["message"] and "receive from rank 3" in by[0]["message"]
    assert (by[0]["began_s"], by[0]["seen_s"]) == (1.25, 2.5)


def test_connections_that_close_at_once_stop_everyone_when_the_transfer_cannot_finish():
    from gradsync.web.failures import failure
    # no check interval: the page's old story (every survivor stops when its transfer cannot finish)
    f = failure(_ring4(), device=2, at=1.5, check_every_s=0)
    assert _stops(f) == {0: (1.5, 1), 1: (1.5, 2), 2: (1.5, None), 3: (1.5, 2)}
    assert sum(f["completed"]) == 4                          # round 0 only
    assert all("its connection closed" in s["message"] for s in f["stopped"] if s["node"] != 2)


def test_a_stall_is_found_at_the_collectives_timeout():
    from gradsync.web.failures import failure
    # rank 2 hangs alive at 1.5 s: nothing closes, so everyone waits for the deadline, 8 s after
    # the collective began; meanwhile 1 and 3 finish what they can (0 -> 1 and 3 -> 0 of round 1)
    f = failure(_ring4(), device=2, at=1.5, detection="stall", timeout_s=8.0)
    assert _stops(f) == {0: (8.0, 1), 1: (8.0, 2), 2: (1.5, None), 3: (8.0, 2)}
    assert sum(f["completed"]) == 6
    assert all("did not answer before the timeout" in s["message"] for s in f["stopped"] if s["node"] != 2)
    assert f["stopped"][2]["message"].startswith("stalled")


def test_detection_uses_the_runtimes_own_check_interval_and_timeout():
    from gradsync.algorithms import build
    from gradsync.model.simulate import simulate
    from gradsync.model.topology import preset
    from gradsync.runtime.request import DEFAULT_TIMEOUT
    from gradsync.runtime.transport.shm.group import CHECK_EVERY_S
    from gradsync.web.failures import detected, detection_defaults, failure

    assert detection_defaults() == {"modes": ["crash", "stall"], "check_every_s": CHECK_EVERY_S, "timeout_s": DEFAULT_TIMEOUT}
    assert detected("crash", 0.01, 60.0, 0.002, 0.0065) == pytest.approx(0.012)
    assert detected("crash", 0.01, 60.0, 0.002, 0.0315) == pytest.approx(0.032)   # the check after it
    assert detected("crash", 0.01, 60.0, 0.02, 0.0065) == pytest.approx(0.03)     # waits from after the death
    r = simulate(build("ring", 8, 4_000_000), preset("ring", 8))
    crash = failure(r, 5, 0.4 * r.time)
    assert (crash["check_every_s"], crash["timeout_s"]) == (CHECK_EVERY_S, DEFAULT_TIMEOUT)
    assert len(crash["stopped"]) == 8
    for s in crash["stopped"]:
        if s["node"] != 5:          # each stops at a check of its own, within one interval of the failure reaching it
            late = s["at_s"] - max(s["began_s"], s["seen_s"])
            assert 0 <= late <= CHECK_EVERY_S * (1 + 1e-9) and s["at_s"] > s["died_s"], s
    stall = failure(r, 5, 0.4 * r.time, detection="stall")
    assert {s["at_s"] for s in stall["stopped"] if s["node"] != 5} == {DEFAULT_TIMEOUT}
    with pytest.raises(ValueError):
        failure(r, 5, 0.0, detection="hang")


def test_the_api_tells_a_stall_from_a_crash(client):
    body = {"algorithm": "ring", "workers": 6, "size": "16MB"}
    crash = _eventually(client.post, "/api/simulate", json=body | {"fail": {"device": 2, "at": 0.3}}).json()["failure"]
    stall = _eventually(client.post, "/api/simulate", json=body | {"fail": {"device": 2, "at": 0.3, "detection": "stall",
                                                                            "timeout_s": 5}}).json()["failure"]
    assert crash["detection"] == "crash" and stall["detection"] == "stall" and stall["timeout_s"] == 5
    assert all(s["at_s"] == 5 and "timeout" in s["message"] for s in stall["stopped"] if s["node"] != 2)
    assert all(s["died_s"] < s["at_s"] <= max(s["began_s"], s["seen_s"]) + crash["check_every_s"] * (1 + 1e-9)
               for s in crash["stopped"] if s["node"] != 2)
    assert stall["recovery"] == crash["recovery"]
    presets = client.get("/api/presets").json()
    assert presets["detection"]["check_every_s"] == crash["check_every_s"]
    bad = client.post("/api/simulate", json=body | {"fail": {"device": 2, "at": 0.3, "detection": "hang"}})
    assert bad.status_code == 422 and "detection" in bad.text


def test_compare_curve_passes_through_the_seed_figures(client):
    c = _eventually(client.get, "/api/compare?size=160MB").json()
    k = c["workers"].index(4)
    for mark in c["book_marks"]:
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
    r = _eventually(client.post, "/api/simulate", json={"algorithm": "sharded", "workers": 64})
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
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:        # a background computation still running: not a test result
        proc.kill()
        proc.wait(timeout=10)


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


def test_the_narration_names_when_the_failure_was_noticed(page):
    page.select_option("#topology", "ring")
    page.select_option("#algorithm", "ring")
    page.fill("#fail-device", "5")
    page.eval_on_selector("#fail-at", "(e) => e.value = '0.4'")
    page.click("#fail")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.detection === 'crash'")
    f = page.evaluate("window.gradsyncStats.failure")
    assert f["at_s"] < f["first_s"] <= f["last_s"] <= f["end_s"]
    page.evaluate(f"window.gradsyncView.seek({(f['at_s'] + f['first_s']) / 2})")     # dead, not yet noticed
    assert "nobody has noticed yet" in page.text_content("#narration")
    page.evaluate(f"window.gradsyncView.seek({f['first_s']})")
    text, when = page.text_content("#narration"), page.evaluate(f"window.gradsyncView.fmt({f['first_s']})")
    assert f"noticed at {when} (its next liveness check, every 10.0 ms)" in text, text
    page.select_option("#fail-how", "stall")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.detection === 'stall'")
    f = page.evaluate("window.gradsyncStats.failure")
    assert f["first_s"] == 60.0
    page.evaluate(f"window.gradsyncView.seek({f['end_s']})")
    assert "noticed at 60.0 s (the timeout, 60.0 s after the collective began" in page.text_content("#narration")
    assert "stalls" in page.text_content("#numbers")
    page.click("#heal")
    page.select_option("#fail-how", "crash")
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


# ---- the API's bounds: every bad input is a 4xx with valid JSON --------------------------------

@pytest.mark.parametrize("body", [
    {"bandwidth": 1e-300}, {"latency": 1e308}, {"bandwidth": True}, {"workers": True}, {"latency": "2 years"},
    {"algorithm": "cerar", "workers": 8, "components": 25}, {"size": "1" * 100},
])
def test_out_of_range_inputs_are_refused_with_valid_json(client, body):
    r = client.post("/api/simulate", json=body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    detail = json.loads(r.text)["detail"]                     # strict JSON: no Infinity, no NaN
    assert isinstance(detail, str) and len(r.text) < 2000


def test_a_chunked_body_over_the_limit_is_refused_unread(client):
    def chunks():
        for _ in range(20):
            yield b" " * 1024 * 1024                         # 20 MB without a content-length
    r = client.post("/api/simulate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and len(r.content) < 200


def test_cerar_designs_the_view_builds_are_bounded_and_refused_ones_are_marked(client):
    r = _eventually(client.post, "/api/simulate", json={"algorithm": "cerar", "workers": 8, "components": 24})
    assert r.status_code == 200
    e = r.json()["estimate"]
    assert e["refused"] == (e["error"] > e["limit"]) and e["refused"]          # 3N is past the error limit
    from gradsync.coding import cerar
    assert e["limit"] == cerar.DEFAULT_MAX_ERROR
    ok = _eventually(client.post, "/api/simulate", json={"algorithm": "cerar", "workers": 8}).json()["estimate"]
    assert not ok["refused"] and ok["error"] <= ok["limit"]


def test_compare_follows_the_codec(client):
    # on 100 Mbit/s links the wire is the time: fp16's curve is half of float32's, closed forms too
    q = "/api/compare?size=16MB&topology=ethernet&bandwidth=100Mbit/s&algorithm=ring"
    plain, half = _eventually(client.get, q).json(), _eventually(client.get, q + "&compression=fp16").json()
    assert half["compression"] == "fp16" and plain["compression"] is None
    for key in ("simulated_s", "closed_form_s"):
        ratio = [h / p for h, p in zip(half["curves"]["ring"][key], plain["curves"]["ring"][key])]
        assert all(0.45 < r < 0.55 for r in ratio), (key, ratio)


def test_compare_follows_topology_links_and_cerar(client):
    base = _eventually(client.get, "/api/compare?size=16MB&topology=dgx-2&algorithm=ring").json()
    assert base["workers"][-1] == 16 and "dgx-2" in base["topology"]
    slow = _eventually(client.get, "/api/compare?size=16MB&topology=dgx-2&algorithm=ring&bandwidth=1GB/s").json()
    ratio = [a / b for a, b in zip(slow["curves"]["ring"]["simulated_s"], base["curves"]["ring"]["simulated_s"])]
    assert min(ratio) > 10                                     # 150 GB/s NVSwitch links down to 1 GB/s
    cerar = _eventually(client.get, "/api/compare?size=16MB&topology=ring&algorithm=cerar&components=12").json()
    sim = cerar["curves"]["cerar"]["simulated_s"]
    # c = 12 is allowed up to 3N: from N = 4 on; refused below (None), never silently replaced
    assert [s is None for s in sim] == [n * 3 < 12 for n in cerar["workers"]]
    assert client.get("/api/compare?size=16MB&bandwidth=-1").status_code == 400


# ---- narration and layouts: true to the schedule and the topology -------------------------------

def test_ring_narration_at_four_workers_matches_the_schedule(client):
    from gradsync.algorithms import ring
    d = _eventually(client.post, "/api/simulate", json={"algorithm": "ring", "topology": "ring", "workers": 4, "size": "16MB"}).json()
    s = ring.schedule(4, d["elements"])
    t, names = s.transfers, [d["topology"]["nodes"][p]["name"] for p in d["placement"]]
    chunk = len(d["cells"]) - 1
    assert chunk == 4 and len(d["narration"]) == s.rounds == 6
    from gradsync import algorithms
    from gradsync.web.lesson import narration
    listed = narration(algorithms.get("ring"), s, d["cells"], names)   # with each round's transfers one by one
    for r, step in enumerate(d["narration"]):
        assert step["text"] == listed[r]["text"] and "transfers" not in step
        phase, k = ("reduce-scatter", r + 1) if r < 3 else ("all-gather", r - 2)
        assert step["text"].startswith(f"{phase}, step {k} of 3: every worker i sends chunk ")
        assert ("adds it" in step["text"]) == (r < 3)
        sent = t[t["round"] == r]
        for src, dst, offset in zip(sent["src"], sent["dst"], sent["offset"]):
            c = int(np.searchsorted(d["cells"], offset, side="right") - 1)
            assert f"{names[src]} -> {names[dst]}: chunk {c}" in listed[r]["transfers"]
            # and the rule agrees: chunk i + shift from worker i to worker i + 1, the shift written
            # in one window per phase (i + 1, i, i - 1, i - 2), so its sign never flips halfway
            shift = (c - src) % 4
            said = {0: "chunk i ", 1: "chunk i + 1 ", 2: "chunk i - 2 ", 3: "chunk i - 1 "}[shift]
            assert said in step["text"] and "to worker i + 1 (mod 4)" in step["text"]


def _bezier(a, b, bend, steps=40):
    a, b = np.asarray(a), np.asarray(b)
    d = b - a
    c = (a + b) / 2 + np.array([-d[1], d[0]]) * bend
    u = np.linspace(0, 1, steps)[:, None]
    return (1 - u) ** 2 * a + 2 * (1 - u) * u * c + u ** 2 * b


@pytest.mark.parametrize("name", ["ring", "pcie-switch-4", "p3.16xlarge", "dgx-2", "ethernet", "lowbw-cluster"])
def test_no_link_is_drawn_through_a_node_it_does_not_connect(name):
    from gradsync.model.topology import preset
    from gradsync.web.layout import layout
    for workers in (4, 8, 64) if name in ("ring", "ethernet") else (None,):
        topo = preset(name, workers) if workers else preset(name)
        pos, bends = layout(name, topo)
        pos = np.array(pos)
        for link, bend in zip(topo.links, bends):
            a, b = topo.index[link.a], topo.index[link.b]
            points = _bezier(pos[a], pos[b], bend)
            others = np.delete(np.arange(len(pos)), [a, b])
            gap = np.linalg.norm(points[None, :, :] - pos[others][:, None, :], axis=2).min()
            assert gap > 0.02, (name, workers, link.a, link.b, gap)


# ---- the page: failures, chunks, stale answers, viewports ---------------------------------------

def _frames(page, count=2):
    page.evaluate(f"new Promise(r => {{ let k = {count}; const f = () => (--k ? requestAnimationFrame(f) : r()); requestAnimationFrame(f); }})")


def _load(page, **controls):
    before = page.evaluate("window.gradsyncStats.loadedAt")
    for key, value in controls.items():
        if key in ("algorithm", "topology"):
            page.select_option(f"#{key}", value)
        else:
            page.fill(f"#{key}", str(value))
            page.dispatch_event(f"#{key}", "change")
    page.wait_for_function(f"window.gradsyncStats.loadedAt > {before} && !window.gradsyncStats.pending && "
                           f"document.querySelector('#status').textContent === ''")


@pytest.mark.slow
def test_failing_any_device_of_any_algorithm_never_freezes_the_page(page):
    _load(page, workers=4, size="16MB")
    for algorithm in ("central", "host", "sharded", "ring", "tree", "halving_doubling", "cerar"):
        _load(page, algorithm=algorithm)
        for device in range(4):
            for at in (0.0, 0.1, 0.4, 0.5, 0.9):
                before = page.evaluate("window.gradsyncStats.loadedAt")
                page.fill("#fail-device", str(device))
                page.eval_on_selector("#fail-at", f"(e) => e.value = '{at}'")
                page.click("#fail")
                page.wait_for_function(f"window.gradsyncStats.loadedAt > {before} && !window.gradsyncStats.pending")
                total = float(page.get_attribute("#total-time", "data-time-s"))
                for when in (0, at * total, at * total * 1.0001 + 1e-12, total):   # every drawing path
                    page.evaluate(f"window.gradsyncView.seek({when})")
                    _frames(page)
        # after the last failure the animation goes on: frames keep coming and the picture moves
        page.evaluate(f"window.gradsyncView.seek({total})")   # past the failure, which is marked (and pulses)
        page.click("#play")
        first = page.evaluate("document.querySelector('#view').toDataURL()")
        page.wait_for_timeout(400)
        assert page.evaluate("document.querySelector('#view').toDataURL()") != first, algorithm
    assert page.errors == []


def _reference_counts(d, now):
    """Inputs each node holds per chunk at time ``now``: the timeline replayed on real numbers
    (worker w's input is 2**w in every element), counting the bits of what each chunk holds."""
    t = d["transfers"]
    cuts = np.array(d["cells"])
    held = np.zeros((len(d["placement"]), len(cuts) - 1))
    held[:d["workers"]] = (2.0 ** np.arange(d["workers"]))[:, None]
    for i in sorted((i for i in range(len(t["src"])) if t["done"][i] <= now), key=lambda i: t["done"][i]):
        lo = np.searchsorted(cuts, t["offset"][i], side="right") - 1
        hi = np.searchsorted(cuts, t["offset"][i] + t["count"][i], side="left")
        payload = held[t["src"][i], lo:hi].copy()
        if t["op"][i] == 0:
            held[t["dst"][i], lo:hi] += payload
        else:
            held[t["dst"][i], lo:hi] = payload
    return np.vectorize(lambda v: bin(int(v)).count("1"))(held)


def _hue(rgb):
    import colorsys
    return 360 * colorsys.rgb_to_hsv(*(np.array(rgb[:3]) / 255))[0]


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving_doubling"])
def test_chunk_colours_follow_the_inputs_each_chunk_holds(page, server, algorithm):
    import urllib.request
    _load(page, algorithm=algorithm, workers=4, size="4MB")
    body = {"algorithm": algorithm, "topology": "ring", "workers": 4, "size": "4MB"}
    req = urllib.request.Request(server + "api/simulate", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    d = json.loads(urllib.request.urlopen(req).read())
    k = len(d["cells"]) - 1
    for fraction in (0.2, 0.5, 0.8, 1.0):
        now = fraction * d["time_s"]
        page.evaluate(f"window.gradsyncView.seek({now})")
        _frames(page)
        state = page.evaluate("window.gradsyncView.state()")
        expected = _reference_counts(d, now)
        assert np.array_equal(np.array(state["counts"])[:4], expected[:4]), (algorithm, fraction)
        for node in range(4):
            for c in range(k):
                rgb = page.evaluate(f"(() => {{ const b = window.gradsyncView.cellBox({node}, {c}); "
                                    f"return window.gradsyncView.pixel(b.x + b.w / 2, b.y + b.h - 2, true); }})()")
                # the bottom of a chunk is coloured once it holds an input, in the chunk's own hue
                # (read without the packets, which are drawn over the buffers)
                assert abs((_hue(rgb) - 360 * c / k + 180) % 360 - 180) < 20, (algorithm, fraction, node, c, rgb)
        if fraction == 1.0:
            assert (expected[:4] == 4).all()
    assert page.errors == []


@pytest.mark.slow
def test_stale_answers_never_overwrite_newer_ones(page):
    # the first request of each kind is held back and answered after the second
    held = {"simulate": 0, "compare": 0}

    def slow(route, kind):
        held[kind] += 1
        if held[kind] == 1:
            time.sleep(1.5)
        try:
            route.continue_()
        except Exception:
            pass                                              # aborted by the page: as intended

    page.route("**/api/simulate", lambda route: slow(route, "simulate"))
    page.route("**/api/compare?*size=100MB*", lambda route: slow(route, "compare"))
    page.fill("#size", "100MB"); page.dispatch_event("#size", "change")
    page.wait_for_timeout(100)
    page.fill("#size", "10MB"); page.dispatch_event("#size", "change")
    page.wait_for_timeout(3000)
    assert page.evaluate("window.gradsyncStats.chart.bytes") == 10_000_000
    assert "10 MB" in page.text_content("#summary") or "10.0 MB" in page.text_content("#summary")
    assert page.errors == []


@pytest.mark.parametrize("size", [(390, 844), (1920, 1080)])
def test_phone_and_wide_screens_have_no_sideways_scroll_and_no_tiny_text(browser, server, size):
    page = browser.new_page(viewport={"width": size[0], "height": size[1]}, device_scale_factor=2)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server)
    page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0 && window.gradsyncStats.chartApplied > 0")
    page.wait_for_timeout(500)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= size[0]
    smallest = page.evaluate("""Math.min(...[...document.querySelectorAll('body *')]
        .filter(e => [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()) && e.offsetParent !== null)
        .map(e => parseFloat(getComputedStyle(e).fontSize)))""")
    assert smallest >= 11 and page.evaluate("window.gradsyncStats.minFont") >= 11
    # high-DPI: the canvas has a backing store of devicePixelRatio times its CSS size
    assert page.evaluate("document.querySelector('#view').width") == pytest.approx(
        2 * page.evaluate("document.querySelector('#view').clientWidth"), abs=2)
    if size[0] >= 1900:   # the chart is above the fold on a wide screen
        assert page.evaluate("document.querySelector('#chart').getBoundingClientRect().top") < size[1]
    page.close()
    assert errors == []


def test_keyboard_controls_and_position_kept_across_changes(page):
    page.focus("body")
    page.keyboard.press(" ")
    assert page.text_content("#play") == "play"
    page.evaluate("window.gradsyncView.seek(0)")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("window.gradsyncView.state().now") > 0
    total = float(page.get_attribute("#total-time", "data-time-s"))
    page.evaluate(f"window.gradsyncView.seek({total / 2})")
    _load(page, algorithm="halving_doubling")
    new_total = float(page.get_attribute("#total-time", "data-time-s"))
    assert page.evaluate("window.gradsyncView.state().now") == pytest.approx(new_total / 2, rel=0.05)


def test_fixed_topologies_set_the_workers_field_and_the_chart_marks_the_animated_run(page):
    _load(page, topology="pcie-switch-4")
    assert page.input_value("#workers") == "4" and "4 workers" in page.text_content("#summary")
    page.wait_for_function("window.gradsyncStats.chart && Object.keys(window.gradsyncStats.chart.curves).length === "
                           "document.querySelector('#algorithm').options.length")
    assert "cerar" in page.evaluate("Object.keys(window.gradsyncStats.chart.curves)")
    mark = page.evaluate("window.gradsyncStats.chartMark")
    assert mark["algorithm"] == "ring" and mark["workers"] == 4
    assert mark["time_s"] == float(page.get_attribute("#total-time", "data-time-s"))     # on the run's own curve


def test_a_refused_cerar_design_is_shown_in_red(page):
    _load(page, algorithm="cerar", workers=8, components=24)
    assert "refuses" in page.text_content("#numbers")
    total = float(page.get_attribute("#total-time", "data-time-s"))
    page.evaluate(f"window.gradsyncView.seek({total})")
    _frames(page)
    rgb = page.evaluate("(() => { const b = window.gradsyncView.cellBox(0, 0); return window.gradsyncView.pixel(b.x + 2, b.y + 7); })()")
    assert rgb[0] > 200 and rgb[1] < 100 and rgb[2] < 100, rgb


def test_work_over_the_budget_is_answered_busy_then_served_from_the_cache(client, monkeypatch):
    from gradsync.web import view
    monkeypatch.setattr(view, "REQUEST_BUDGET_S", 0.0)
    body = {"algorithm": "tree", "workers": 13, "size": "7MB"}
    first = client.post("/api/simulate", json=body)
    assert first.status_code == 202 and first.headers["retry-after"] == "1" and "background" in first.json()["detail"]
    monkeypatch.setattr(view, "REQUEST_BUDGET_S", 30.0)
    again = client.post("/api/simulate", json=body)
    assert again.status_code == 200 and again.json()["workers"] == 13


@pytest.mark.slow
def test_the_static_export_plays_from_plain_files(browser, tmp_path):
    run = subprocess.run([sys.executable, "-m", "gradsync", "serve", "--export", str(tmp_path / "view")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto((tmp_path / "view" / "index.html").as_uri())              # file://: no server at all
    page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0")
    page.select_option("#topology", "pcie-switch-4")
    page.select_option("#algorithm", "sharded")
    page.wait_for_function("document.querySelector('#summary').textContent.startsWith('sharded on pcie-switch-4')")
    # the exported timeline is the simulator's: D2L's 15 ms for sharded aggregation on 4 GPUs
    assert float(page.get_attribute("#total-time", "data-time-s")) == pytest.approx(0.015, rel=1e-3)
    page.wait_for_function("window.gradsyncStats.chartApplied >= document.querySelector('#algorithm').options.length")
    # every control is live there now: the page times the exported schedules itself
    assert not page.is_disabled("#workers") and not page.is_disabled("#fail") and not page.is_disabled("#size")
    assert "MB" in run.stdout and "index.html" in run.stdout
    page.close()
    assert errors == []


def test_a_second_server_on_a_busy_port_says_so_in_one_line_and_exits_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "gradsync", "serve", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""             # no URL printed for a server that never ran
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]


def test_a_job_finished_before_its_callback_is_added_does_not_deadlock():
    # a fast job can finish before run() adds its done-callback, which then runs in the asking
    # thread: it must not wait for a lock that thread holds
    import threading

    from gradsync.web import view
    worker, results = view._Background(), []
    asker = threading.Thread(target=lambda: results.extend(worker.run(("instant", k), int, k) for k in range(300)),
                             daemon=True)
    asker.start()
    asker.join(30)
    assert not asker.is_alive() and results == list(range(300))


@pytest.mark.slow
def test_the_served_page_keeps_the_lesson_above_the_fold_errors_by_their_field_and_no_stale_failure(browser, server):
    # the same layout and rules as the static export's (tests/test_web_export.py), here through the server
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server)
    page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0")
    for name in ("tree", "cerar", "ring"):
        _load(page, algorithm=name)
        for id_ in ("view", "timeline", "narration", "explanation", "algorithm", "fail"):
            box = page.evaluate(f"(() => {{ const r = document.getElementById('{id_}').getBoundingClientRect(); "
                                "return [r.top, r.bottom, r.height]; })()")
            assert box[2] > 0 and box[0] >= 0 and box[1] <= 768, (name, id_, box)
    page.fill("#workers", "1")
    page.dispatch_event("#workers", "change")
    page.wait_for_selector(".field-error")
    below = page.evaluate("document.querySelector('.field-error').previousElementSibling.contains(document.getElementById('workers'))")
    assert below and "workers" in page.text_content(".field-error")
    _load(page, workers=8)
    page.fill("#fail-device", "7")
    page.click("#fail")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.device === 7")
    _load(page, workers=4)
    assert page.evaluate("window.gradsyncStats.failure") is None and "cleared" in page.text_content("#fail-note")
    _load(page, algorithm="sharded")                  # later changes are not refused
    assert page.query_selector(".field-error") is None and errors == []
    page.close()
