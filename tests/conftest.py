import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# The live view's browser tests share one Chromium and one static export per run (web_site.py).
from web_site import browser, offline, site  # noqa: E402,F401
