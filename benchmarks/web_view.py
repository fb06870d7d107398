"""The live view's speed in headless Chromium, and its screenshots.

Measures, against a local `gradsync serve` it starts:
- frames per second while animating 64 workers with the narration and the timeline drawn;
- the time from a parameter change to the first frame drawn with the new simulation (request,
  simulation, JSON, parse, drawing), per algorithm at N = 4, 8, 16, 32, 64, 17;
- the time from navigation to the first frame of a collective (first load, cold server caches).

With --screenshots DIR it also saves each algorithm at mid-run (8 workers, PCIe/NVLink
presets where they tell most) as DIR/web-<algorithm>.png.

With --export DIR it measures the static export instead (written to DIR by ``gradsync serve
--export``, opened from file://, the simulator running in the page): N = 4, 8, 16, 32, 64, 24.

Usage: python benchmarks/web_view.py [--screenshots docs/figures] [--export DIR]
Targets: >= 30 frames per second at 64 workers; updates within 100 ms (median) at N = 64 in the
export. The load average is printed: the figures are upper bounds on a busy machine.
"""

import argparse
import json
import os
import socket
import urllib.error
import urllib.request
import statistics
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from gradsync import algorithms

ALGORITHMS = algorithms.names()
SHOTS = {"central": "pcie-switch-4", "host": "pcie-switch-4", "sharded": "pcie-switch-4", "ring": "p3.16xlarge",
         "tree": "ring", "halving_doubling": "p3.16xlarge", "hierarchical": "lowbw-cluster", "cerar": "ring"}


def _server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gradsync", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("gradsync serve did not start")


def _change(page, **controls):
    before = page.evaluate("window.gradsyncStats.loadedAt")
    for key, value in controls.items():
        if key in ("algorithm", "topology"):
            page.select_option(f"#{key}", value)
        else:
            page.fill(f"#{key}", str(value))
            page.dispatch_event(f"#{key}", "change")
    page.wait_for_function(f"window.gradsyncStats.loadedAt > {before} && !window.gradsyncStats.pending")
    page.wait_for_function("window.gradsyncStats.updateMs !== null")


def _timed(url, body=None):
    """Seconds and status of one request (a POST when ``body`` is given)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        status = urllib.request.urlopen(req, timeout=120).status
    except urllib.error.HTTPError as e:
        status = e.code
    return time.perf_counter() - t0, status


def costly_requests(url):
    """The costliest requests the API accepts, cold (sizes no earlier request used)."""
    rows = []
    for n, c, eps in ((64, 192, None), (64, 192, 0.5), (48, 144, 1e-3)):
        body = {"algorithm": "cerar", "workers": n, "components": c, "size": "123MB", **({"eps": eps} if eps else {})}
        rows.append((f"simulate cerar N={n} c={c} eps={eps}", *_timed(url + "api/simulate", body)))
    for name in ALGORITHMS:
        rows.append((f"compare {name}, ring, 2-64 workers", *_timed(url + f"api/compare?size=77MB&topology=ring&algorithm={name}")))
    return rows


def _shot(page, path, fraction=0.45):
    total = float(page.get_attribute("#total-time", "data-time-s"))
    page.evaluate(f"window.gradsyncView.seek({total * fraction})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(path))


def _screenshots(page, folder):
    """Each algorithm at mid-run on a 1366 x 768 laptop screen; then a phone, a 1920 monitor,
    and one chunk followed."""
    folder.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1366, "height": 768})
    for algorithm, topology in SHOTS.items():
        _change(page, topology=topology)
        _change(page, algorithm=algorithm, workers=8 if topology in ("ring", "p3.16xlarge", "lowbw-cluster") else 4)
        _shot(page, folder / f"web-{algorithm}.png")
    _change(page, topology="dgx-2")
    _change(page, algorithm="ring", workers=16)
    _shot(page, folder / "web-dgx-2.png", 0.3)
    _change(page, topology="ring")
    _change(page, algorithm="ring", workers=8)
    page.evaluate("window.gradsyncView.follow(3)")
    _shot(page, folder / "web-follow.png", 0.3)
    page.evaluate("window.gradsyncView.follow(null)")
    page.fill("#fail-device", "5")
    page.select_option("#fail-how", "stall")
    page.click("#fail")
    page.wait_for_function("window.gradsyncStats.failure && window.gradsyncStats.failure.detection === 'stall'")
    _shot(page, folder / "web-stall.png", 0.5)
    page.click("#heal")
    page.wait_for_function("window.gradsyncStats.failure === null")
    page.evaluate("window.gradsyncView.tour(5)")
    page.wait_for_function("window.gradsyncStats.tour && window.gradsyncStats.compare")
    page.wait_for_timeout(500)
    page.screenshot(path=str(folder / "web-tour-side-by-side.png"))
    page.click("#tour-end")
    page.select_option("#beside", "")
    _change(page, topology="ring")
    _change(page, algorithm="tree", workers=15)
    for name, (w, h) in (("web-phone.png", (390, 844)), ("web-wide.png", (1920, 1080))):
        page.set_viewport_size({"width": w, "height": h})
        page.wait_for_timeout(500)
        _shot(page, folder / name, 0.4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", type=Path, help="save each algorithm at mid-run here")
    parser.add_argument("--export", type=Path, help="measure the static export written here instead of the server")
    args = parser.parse_args()
    if args.export:
        subprocess.run([sys.executable, "-m", "gradsync", "serve", "--export", str(args.export)], check=True)
        server, url = None, (args.export / "index.html").resolve().as_uri()
    else:
        server, url = _server()
    counts = (4, 8, 16, 32, 64, 24) if args.export else (4, 8, 16, 32, 64, 17)
    load_before = os.getloadavg()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_function("window.gradsyncStats && window.gradsyncStats.frames > 0 && window.gradsyncStats.timeS > 0")
            first_frame = page.evaluate("window.gradsyncStats.loadedAt")      # ms since navigation start
            first_wall = (time.perf_counter() - t0) * 1000
            updates = {}
            for algorithm in ALGORITHMS:
                _change(page, algorithm=algorithm)
                for n in counts:
                    page.evaluate("window.gradsyncStats.updateMs = null")
                    _change(page, workers=n)
                    updates.setdefault(algorithm, []).append((n, page.evaluate("window.gradsyncStats.updateMs")))
            _change(page, algorithm="ring", workers=64)
            page.wait_for_timeout(1000)
            start = page.evaluate("[window.gradsyncStats.frames, performance.now()]")
            page.wait_for_timeout(4000)
            end = page.evaluate("[window.gradsyncStats.frames, performance.now(), window.gradsyncStats.narrated]")
            fps = (end[0] - start[0]) / ((end[1] - start[1]) / 1000)
            if args.screenshots:
                _screenshots(page, args.screenshots)
            browser.close()
        costly = [] if server is None else costly_requests(url)
    finally:
        if server is not None:
            server.terminate()
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; after: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"first frame after load: {first_frame:.0f} ms after navigation ({first_wall:.0f} ms wall, cold server)")
    print(f"frames per second, 64 workers animating (ring), narration and timeline drawn: {fps:.1f}")
    print(f"  narration at the end of the measurement: {end[2]!r}")
    print(f"update time from a change to the first new frame (N = {', '.join(map(str, counts))}):")
    worst = max((ms, a, n) for a, rows in updates.items() for n, ms in rows)
    for algorithm, rows in updates.items():
        times = [ms for _, ms in rows]
        print(f"  {algorithm:<18} median {statistics.median(times):4.0f} ms, max {max(times):4.0f} ms: "
              + ", ".join(f"{ms:.0f}" for ms in times))
    print(f"worst case: {worst[0]:.0f} ms ({worst[1]}, N = {worst[2]})")
    at64 = [ms for rows in updates.values() for n, ms in rows if n == 64]
    print(f"N = 64 over the algorithms: median {statistics.median(at64):.0f} ms, max {max(at64):.0f} ms")
    print("costliest requests, cold caches (seconds, HTTP status):")
    for what, seconds, status in costly:
        print(f"  {what:<40} {seconds:5.2f} s  {status}")


if __name__ == "__main__":
    main()
