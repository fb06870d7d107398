"""The live view's speed in headless Chromium: frames per second while animating 64 workers,
and the time from a parameter change to the first frame drawn with the new data.

Usage: python benchmarks/web_view.py  (needs Debian's chromium; starts its own server)
Targets: >= 30 frames per second at 64 workers; updates within 200 ms for N <= 64.
"""

import socket
import statistics
import subprocess
import sys
import time

from playwright.sync_api import sync_playwright


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "gradsync", "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1300, "height": 1250})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0")
            updates = {}
            for algorithm in ("ring", "tree", "sharded", "halving_doubling", "cerar"):
                page.select_option("#algorithm", algorithm)
                for n in (8, 16, 32, 64, 17, 64):
                    page.fill("#workers", str(n))
                    page.dispatch_event("#workers", "change")
                    page.wait_for_function(f"window.gradsyncStats.drawnWorkers === {n} && "
                                           f"document.querySelector('#summary').textContent.startsWith('{algorithm}')")
                    page.wait_for_timeout(150)
                    updates.setdefault(algorithm, []).append(page.evaluate("window.gradsyncStats.updateMs"))
            page.select_option("#algorithm", "ring")
            page.wait_for_timeout(500)
            start = page.evaluate("[window.gradsyncStats.frames, performance.now()]")
            page.wait_for_timeout(3000)
            end = page.evaluate("[window.gradsyncStats.frames, performance.now()]")
            fps = (end[0] - start[0]) / ((end[1] - start[1]) / 1000)
            browser.close()
    finally:
        server.terminate()
    print(f"frames per second, 64 workers animating (ring): {fps:.1f}")
    print("update time from a change to the first new frame, per algorithm (N = 8, 16, 32, 64, 17, 64):")
    for algorithm, times in updates.items():
        print(f"  {algorithm:<18} median {statistics.median(times):.0f} ms, max {max(times):.0f} ms: "
              + ", ".join(f"{t:.0f}" for t in times))


if __name__ == "__main__":
    main()
