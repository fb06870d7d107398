"""The ``gradsync`` command line. Bad input: one line on stderr and exit code 2.

``main`` is the click group (entry point ``gradsync.cli:main``, and ``python -m gradsync``); it
lives in ``common.py`` beside what every command shares, and each command family registers on
it when its module is imported here:

- ``models``: compare, simulate; ``choice``: tune, explain (the models of time; nothing runs)
- ``catalog``: list, cerar (what is registered; CERAR's designs)
- ``benchmark``: bench; ``calibration``: calibrate (worker processes, timed)
- ``training``: train, also on elastic agents
- ``serve``: serve (the live view), store (a rendezvous store)
- ``records``: doctor, trace compare, trace merge (what runs left behind)
"""

from . import benchmark, calibration, catalog, choice, models, records, serve, training   # noqa: F401  (they register)
from .common import main

__all__ = ["main"]
