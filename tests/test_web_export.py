"""The static export (``gradsync serve --export``): its model read by the page against
gradsync's own simulator, and the page opened from file:// with the network blocked."""

import math
import os
import random

import pytest

from gradsync import algorithms
from gradsync.errors import ConfigError
from gradsync.model.simulate import simulate
from gradsync.web import failures, site_model, view
from web_site import _offline_page   # its fixtures (site, browser, offline) come from conftest.py: one export per run

CONFIGS = int(os.environ.get("GRADSYNC_WEB_CONFIGS", 620))      # more: GRADSYNC_WEB_CONFIGS=2000


def test_cut_labels_reproduce_every_schedule_at_sizes_they_were_not_fitted_at():
    # the labels are fitted at one size; here they are read at others and compared with the
    # schedule gradsync builds there (transfer for transfer: pieces, order, empties dropped)
    rng = random.Random(3)
    for name in ("ring", "sharded", "halving_doubling", "tree", "cerar"):
        for n in (3, 5, 8):
            options = {"segments": 4} if name == "tree" else {}
            form = site_model.schedule_data(lambda d: algorithms.build(name, n, d, dtype="float32", **options))
            for d in (rng.randrange(1000, 10**9) for _ in range(5)):
                s = algorithms.build(name, n, d, dtype="float32", **options)
                offset, count, _ = site_model.counts_at(form, d)
                assert count[count > 0].tolist() == s.transfers["count"].tolist()
                assert offset[count > 0].tolist() == s.transfers["offset"].tolist()


def test_a_schedule_the_labels_cannot_describe_is_refused_not_approximated():
    with pytest.raises(site_model.Unfit):      # pieces of 1/3 rounded up, plus one: no chunk_bounds gives them
        site_model.schedule_data(_thirds)


def _thirds(d):
    import numpy as np

    from gradsync.core.schedule import REDUCE, Schedule, transfers
    third = -(-d // 3)
    return Schedule("odd", 3, d, transfers(0, np.array([0, 1]), np.array([1, 2]), 0, min(third + 1, d), REDUCE))


def _configs(core, count, seed=11):
    rng = random.Random(seed)
    names, presets = core["algorithms"], core["topologies"]
    out = []
    for k in range(count):
        preset = presets[k % len(presets)]
        p = {"algorithm": names[(k // len(presets)) % len(names)], "topology": preset,
             "workers": rng.choice(core["worker_counts"][preset]),
             "size": str(int(10 ** rng.uniform(0.6, 9.3)))}         # 4 B to 2 GB: every size the served page takes
        if rng.random() < 0.5:
            p["bandwidth"] = rng.choice([f"{10 ** rng.uniform(6, 12):.6g}", "100Mbit/s", "10Gbit/s", "25GB/s"])
        if rng.random() < 0.4:
            p["latency"] = rng.choice([f"{rng.uniform(0, 2e-4):.3g}", "5us", "0", "1ms"])
        if rng.random() < 0.3:
            p["fail"] = {"device": rng.randrange(p["workers"]), "at": round(rng.random(), 2)}
            # how it is found: the runtime's crash (liveness checks) by default, else a stall at a
            # timeout, or another check interval (0: connections that close at once)
            how = rng.random()
            if how < 0.3:
                p["fail"] |= {"detection": "stall", "timeout_s": rng.choice([60.0, float(f"{10 ** rng.uniform(-5, 0):.3g}")])}
            elif how < 0.6:
                p["fail"]["check_every_s"] = rng.choice([0.0, float(f"{10 ** rng.uniform(-6, -1):.3g}")])
        if rng.random() < 0.25:
            p["compression"] = rng.choice(view.COMPRESSIONS)
        out.append(p)
    return out


def _reference(p):
    """gradsync.simulate's answer for one configuration, as the server's view builds it."""
    topo = view.topology_for(p["topology"], p["workers"], p.get("bandwidth"), p.get("latency"))
    n, nbytes = len(topo.workers), int(p["size"])
    try:
        schedule, itemsize, _ = view.schedule_for(p["algorithm"], topo, n, nbytes, p.get("compression"), None, None)
        result = simulate(schedule, topo, itemsize)
    except ConfigError:
        return None
    out = {"time": result.time}
    if p.get("fail"):
        fail = p["fail"]
        f = failures.failure(result, fail["device"], fail["at"] * result.time, fail.get("detection", "crash"),
                             fail.get("check_every_s"), fail.get("timeout_s"))
        out["stopped"] = [s["at_s"] for s in f["stopped"]]
        out["delay"] = [s["at_s"] - s["died_s"] for s in f["stopped"]]      # the detection delay
        out["why"] = [[s["node"], s["waited_for"], s["began_s"], s["seen_s"], s["message"]] for s in f["stopped"]]
        out["completed"] = sum(f["completed"])
        out["parameters"] = [f["detection"], f["check_every_s"], f["timeout_s"]]
    return out


RUN_ALL = """([configs]) => configs.map((p) => {
  try {
    const d = gradsyncSite.simulation(window.gradsyncCore, window.gradsyncSchedules, p);
    const f = d.failure;
    return { time: d.time_s, stopped: f ? f.stopped.map((s) => s.at_s) : null,
             delay: f ? f.stopped.map((s) => s.at_s - s.died_s) : null,
             why: f ? f.stopped.map((s) => [s.node, s.waited_for, s.began_s, s.seen_s, s.message]) : null,
             parameters: f ? [f.detection, f.check_every_s, f.timeout_s] : null,
             completed: f ? f.completed.filter(Boolean).length : null };
  } catch (e) { return { error: e.message, field: e.field || null }; }
})"""


def test_the_pages_times_are_gradsyncs_over_random_configurations(offline):
    # >= 500 configurations, every algorithm on every preset, random sizes, bandwidths,
    # latencies and failures, timed by the page's JS in one call and by gradsync.simulate
    page = offline
    core = page.evaluate("window.gradsyncCore")
    configs = _configs(core, CONFIGS)
    got = page.evaluate(RUN_ALL, [configs])
    checked = failed = identical = delayed = stalled = refused = 0
    worst = 0.0
    for p, mine in zip(configs, got):
        want = _reference(p)
        if want is None:                      # refused by the server's view: refused here too, by its field
            assert mine.get("field") in ("algorithm", "compression"), (p, mine)
            refused += 1
            continue
        assert "error" not in mine, (p, mine)
        assert mine["time"] == pytest.approx(want["time"], rel=1e-6, abs=1e-15), p
        identical += mine["time"] == want["time"]
        worst = max(worst, abs(mine["time"] - want["time"]) / want["time"])
        if p.get("fail"):
            assert mine["stopped"] == pytest.approx(want["stopped"], rel=1e-6, abs=1e-15), p
            # each survivor's detection delay, and when it began waiting, when the failure reached
            # it, whom it waited for and its PeerError, as gradsync.web.failures works them out
            assert mine["delay"] == pytest.approx(want["delay"], rel=1e-6, abs=1e-15), p
            assert [w[:2] + w[4:] for w in mine["why"]] == [w[:2] + w[4:] for w in want["why"]], p
            for a, b in zip(mine["why"], want["why"]):
                assert a[2:4] == pytest.approx(b[2:4], rel=1e-6, abs=1e-15) if b[2] is not None else a[2] is None, p
            assert mine["parameters"] == want["parameters"] and mine["completed"] == want["completed"], p
            failed += 1
            delayed += any(d > 0 for d in want["delay"])
            stalled += want["parameters"][0] == "stall"
        checked += 1
    print(f"\n{checked} configurations ({failed} with a failure, {delayed} of them found after a delay, {stalled} "
          f"stalls, {sum('compression' in p for p in configs)} with a codec): {identical} times bit-identical, worst relative "
          f"difference {worst:.3g}; {refused} refused by both")
    assert checked >= 500 and failed >= 100 and delayed >= 50 and stalled >= 20
    assert {p["algorithm"] for p in configs} == set(core["algorithms"])
    assert page.outside == [] and page.errors == []


@pytest.mark.slow
def test_the_export_plays_offline_with_every_control_live(browser, site):
    page = _offline_page(browser, site)
    for selector, value in (("#topology", "ring"), ("#algorithm", "ring")):
        page.select_option(selector, value)
    for field, value in (("#workers", "16"), ("#size", "40MB"), ("#bandwidth", "10GB/s"), ("#latency", "5us")):
        page.fill(field, value)
        page.dispatch_event(field, "change")
    page.wait_for_function("document.querySelector('#summary').textContent.includes('16 workers')")
    want = _reference({"algorithm": "ring", "topology": "ring", "workers": 16, "size": "40000000",
                       "bandwidth": "10GB/s", "latency": "5us"})
    assert float(page.get_attribute("#total-time", "data-time-s")) == pytest.approx(want["time"], rel=1e-9)
    page.fill("#fail-device", "3")
    page.click("#fail")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.device === 3")
    assert page.is_visible("#failure-box")
    assert page.outside == [] and page.errors == []
    page.close()


BOXES = """(ids) => Object.fromEntries(ids.map((id) => { const r = document.getElementById(id).getBoundingClientRect();
  return [id, { top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height }]; }))"""
LESSON = ("view", "timeline", "controls", "narration", "narration-detail", "explanation", "algorithm", "workers", "size",
          "bandwidth", "fail")


def test_the_lesson_drawing_and_controls_are_above_the_fold_at_1366x768(offline):
    page = offline
    refused = page.evaluate("""(names) => names.filter((name) => { try {
      gradsyncSite.simulation(window.gradsyncCore, window.gradsyncSchedules, { algorithm: name, topology: 'ring', workers: 8, size: '160MB' });
      return false; } catch (e) { return e.field === 'algorithm'; } })""", page.evaluate("window.gradsyncCore.algorithms"))
    assert set(refused) <= {"nvls", "nvls_tree"}, refused       # no preset of the view has a switch that reduces
    for name in page.evaluate("window.gradsyncCore.algorithms"):
        if name in refused:
            continue
        page.evaluate("(name) => { window.gradsyncView.layoutFor({ algorithm: name, topology: 'ring', workers: 8, size: '160MB' });"
                      " window.gradsyncView.seek(window.gradsyncStats.timeS * 0.45); }", name)
        assert page.text_content("#explain-title") == f"How {name} works" and page.text_content("#narration")
        boxes = page.evaluate(BOXES, list(LESSON))
        for id_, b in boxes.items():
            assert b["height"] > 0 and b["top"] >= 0 and b["bottom"] <= 768, (name, id_, b)
        assert boxes["narration"]["right"] <= 1366 and boxes["view"]["right"] <= boxes["narration"]["left"]
    assert page.outside == [] and page.errors == []


def test_the_failure_story_says_when_each_survivor_noticed_and_why(offline):
    # the runtime's constants, exported as data, drive the page's model and its words
    from gradsync.runtime.request import DEFAULT_TIMEOUT
    from gradsync.runtime.transport.shm.group import CHECK_EVERY_S
    page = offline
    assert page.evaluate("window.gradsyncCore.detection") == {"modes": ["crash", "stall"], "check_every_s": CHECK_EVERY_S,
                                                              "timeout_s": DEFAULT_TIMEOUT}
    base = {"algorithm": "ring", "topology": "ring", "workers": 8, "size": "160MB"}
    for how in ("crash", "stall"):
        page.evaluate("(p) => window.gradsyncView.layoutFor(p)", base | {"fail": {"device": 5, "at": 0.4, "detection": how}})
        f = page.evaluate("window.gradsyncStats.failure")
        assert f["detection"] == how and f["at_s"] < f["first_s"] <= f["end_s"]
        page.evaluate(f"window.gradsyncView.seek({f['first_s']})")
        text, when = page.text_content("#narration"), page.evaluate(f"window.gradsyncView.fmt({f['first_s']})")
        why = "its next liveness check, every 10.0 ms" if how == "crash" else "the timeout, 60.0 s after the collective began"
        assert "died at" in text or "stalled at" in text
        assert f"noticed at {when} ({why}" in text, text
        assert ("stalls" if how == "stall" else "liveness check") in page.text_content("#failure-events")
        # the timeline runs on to the last detection (its last part the gap, when that is much later)
        assert page.evaluate("window.gradsyncView.frac(window.gradsyncStats.failure.end_s)") == pytest.approx(1)
    page.evaluate("(p) => window.gradsyncView.layoutFor(p)", base)
    assert page.evaluate("window.gradsyncStats.failure") is None
    assert page.outside == [] and page.errors == []


def test_an_error_is_shown_beside_its_field_and_a_failure_outliving_its_device_is_cleared(offline):
    page = offline
    page.select_option("#topology", "ring")
    page.select_option("#algorithm", "ring")
    page.fill("#workers", "1")
    page.dispatch_event("#workers", "change")
    page.wait_for_selector(".field-error")
    err, field = page.evaluate(BOXES, ["workers", "workers"])["workers"], page.query_selector(".field-error").bounding_box()
    assert "workers" in page.text_content(".field-error") and 0 <= field["y"] - err["bottom"] < 40 and field["y"] < 768
    assert page.evaluate("document.querySelector('#stage').classList.contains('stale')")
    page.fill("#workers", "8")
    page.dispatch_event("#workers", "change")
    page.wait_for_function("!document.querySelector('.field-error') && window.gradsyncStats.drawnWorkers === 8")
    page.fill("#fail-device", "7")
    page.click("#fail")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.device === 7")
    page.fill("#workers", "4")                      # device 7 is gone: the failure goes with it
    page.dispatch_event("#workers", "change")
    page.wait_for_function("window.gradsyncStats.drawnWorkers === 4 && window.gradsyncStats.failure === null")
    assert "cleared" in page.text_content("#fail-note") and page.get_attribute("#fail-device", "max") == "3"
    page.select_option("#algorithm", "tree")         # later changes are not refused
    page.wait_for_function("document.querySelector('#summary').textContent.startsWith('tree')")
    assert page.query_selector(".field-error") is None
    assert page.outside == [] and page.errors == []


LAYOUTS = """([presets, counts]) => { const out = [];
  for (const topology of presets) for (const workers of counts) {
    const boxes = window.gradsyncView.layoutFor({ algorithm: "ring", topology, workers, size: "160MB" });
    const canvas = document.getElementById("view").getBoundingClientRect();
    out.push({ topology, workers, drawn: window.gradsyncStats.drawnWorkers, boxes, w: canvas.width, h: canvas.height,
               cell: window.gradsyncView.cell() });
  }
  return out; }"""


@pytest.mark.slow         # the default run's sample: tests/test_web_page.py, at 1366 x 768
@pytest.mark.parametrize("viewport", [(1366, 768), (1920, 1080), (390, 844)])
def test_no_two_labels_or_buffers_overlap_on_any_preset_at_any_worker_count(browser, site, offline, viewport):
    page = offline if viewport == (1366, 768) else _offline_page(browser, site, viewport)
    page.evaluate("window.gradsyncLoadAll()")
    counts = [2, 3, 4, 8, 16, 17, 32, 64]
    fixed = page.evaluate("window.gradsyncCore.fixed_workers")
    drawn = page.evaluate(LAYOUTS, [page.evaluate("window.gradsyncCore.topologies"), counts])
    for d in drawn:
        assert d["drawn"] == min(d["workers"], fixed.get(d["topology"], 64))
        boxes = d["boxes"]
        assert sum(b["kind"] == "node" for b in boxes) >= d["drawn"]
        for i, a in enumerate(boxes):
            assert a["x0"] >= 0 and a["y0"] >= 0 and a["x1"] <= d["w"] and a["y1"] <= d["h"], (d["topology"], d["workers"], a)
            for b in boxes[:i]:
                if a["kind"] == b["kind"] == "node":          # two nodes: circles, with their progress rings
                    apart = math.hypot(a["cx"] - b["cx"], a["cy"] - b["cy"]) >= a["radius"] + b["radius"] - 1e-9
                else:
                    apart = a["x1"] <= b["x0"] or b["x1"] <= a["x0"] or a["y1"] <= b["y0"] or b["y1"] <= a["y0"]
                assert apart, (d["topology"], d["workers"], viewport, a, b)
    # the cells scale with the canvas: 8 workers on a ring get larger cells on a larger screen
    ring8 = next(d for d in drawn if d["topology"] == "ring" and d["workers"] == 8)
    assert ring8["cell"] and ring8["cell"]["w"] >= (10 if viewport[0] < 500 else 16)
    assert page.outside == [] and page.errors == []
    if page is not offline:
        page.close()


def test_labels_say_the_values_in_force_and_step_shows_packets_on_their_links(offline):
    page = offline
    page.select_option("#topology", "ring")
    page.select_option("#algorithm", "ring")
    for field, value in (("#workers", "8"), ("#size", "160MB"), ("#bandwidth", "1GB/s")):
        page.fill(field, value)
        page.dispatch_event(field, "change")
    page.wait_for_function("document.querySelector('#summary').textContent.includes('every link 1.00 GB/s')")
    summary = page.text_content("#summary")
    assert "18GB/s" not in summary and "8 workers" in summary
    # a ring of equal links: every link is as busy as the busiest, and none is called the bottleneck
    assert page.evaluate("window.gradsyncStats.equallyBusy") is True
    assert "equally busy" in page.text_content("#numbers") and "busiest" not in page.text_content("#numbers")
    rounds = page.evaluate("window.gradsyncStats.secondsPerRound")
    assert page.text_content("#speed-label") == "1 round ≈ 0.60 s" and rounds == pytest.approx(0.6)
    page.click("#restart")
    page.click("#play")                         # pause
    seen = []
    for _ in range(4):
        page.click("#step")
        seen.append(page.evaluate("window.gradsyncView.inFlight()"))
    # the stops alternate between events and halfway points, where every packet of the round is on its link
    assert max(seen) == 8 and min(seen) == 0
    page.fill("#bandwidth", "")
    page.dispatch_event("#bandwidth", "change")
    page.select_option("#topology", "lowbw-cluster")
    page.wait_for_function("document.querySelector('#summary').textContent.includes('lowbw-cluster')")
    assert "(set)" not in page.text_content("#summary")
    assert page.evaluate("window.gradsyncStats.equallyBusy") is False      # Ethernet the bottleneck, PCIe less busy
    assert "busiest link" in page.text_content("#numbers")
    assert page.outside == [] and page.errors == []


def test_a_followed_chunk_shows_its_partial_sums_as_the_schedule_carries_them(offline):
    page = offline
    page.evaluate("window.gradsyncView.layoutFor({ algorithm: 'ring', topology: 'ring', workers: 4, size: '1MB' })")
    page.evaluate("window.gradsyncView.follow(2)")
    # every packet's set of inputs has the size schedule.carried_inputs gives it (one-cell packets)
    rows = page.evaluate("window.gradsyncView.carriedSets()")
    assert rows and all(size == carried for _, size, carried, cells in rows if cells == 1)
    total = page.evaluate("window.gradsyncStats.timeS")
    # ring, 4 workers: chunk 2 starts at worker 2, gathers a3, a0, a1 around the ring and is copied back
    page.evaluate(f"window.gradsyncView.seek({total})")
    assert page.evaluate("window.gradsyncView.sums()") == [[0, 1, 2, 3]] * 4
    sums = []
    for f in (0.2, 0.4):
        page.evaluate(f"window.gradsyncView.seek({total} * {f})")
        counts = page.evaluate("window.gradsyncView.state().counts")
        got = page.evaluate("window.gradsyncView.sums()")
        assert [len(x) for x in got] == [c[2] for c in counts]          # the counts drawn are the sets' sizes
        sums.append(page.text_content("#follow"))
    assert "a2 + a3" in " ".join(sums)
    page.evaluate("window.gradsyncView.follow(null)")
    assert page.outside == [] and page.errors == []


def test_the_export_stays_under_20_mb_unpacked(site):
    """The whole view, every family of every algorithm, as files on disk (a student's download)."""
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert 1_000_000 < total < 20_000_000, total
