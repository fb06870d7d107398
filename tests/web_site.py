"""The static export and a Chromium page on it, shared by the test modules that read it (one
export per test run: it takes tens of seconds)."""

import shutil
from pathlib import Path

import pytest

from gradsync.web import export

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export") / "view"
    export.export(folder)
    return folder


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                              "--disable-background-networking", "--no-first-run"])
        yield b
        b.close()


@pytest.fixture(scope="session")
def offline(browser, site):
    """One export page at 1366 x 768 with every schedule loaded, shared by the tests that
    only read it (each leaves it as it found it)."""
    page = _offline_page(browser, site)
    page.evaluate("window.gradsyncLoadAll()")
    yield page
    page.close()


def _offline_page(browser, site, viewport=(1366, 768)):
    """The export's page from file://, every request that is not a local file refused and kept."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.outside, page.errors = [], []

    def guard(route):
        if route.request.url.startswith("file://"):
            return route.continue_()
        page.outside.append(route.request.url)
        return route.abort()
    page.route("**/*", guard)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.goto((site / "index.html").as_uri())
    page.wait_for_function("window.gradsyncStats && window.gradsyncStats.timeS > 0")
    return page
