"""The ``gradsync`` command line. Bad input: one line on stderr and exit code 2.

``main`` is the click group; ``command_line`` runs it as the ``gradsync`` command and
``python -m gradsync``. The group lives in ``common.py`` beside what every command shares,
and each command family registers on it when its module is imported here:

- ``models``: compare, simulate; ``choice``: tune, explain (the models of time; nothing runs)
- ``catalog``: list, cerar (what is registered; CERAR's designs)
- ``benchmark``: bench; ``calibration``: calibrate (worker processes, timed)
- ``training``: train, also on elastic agents
- ``serve``: serve (the live view), store (a rendezvous store)
- ``records``: doctor, trace compare, trace merge (what runs left behind)
"""

import sys

from ..tools.launch import leave_launched
from . import benchmark, calibration, catalog, choice, models, records, serve, training   # noqa: F401  (they register)
from .common import main

__all__ = ["command_line", "main"]


def command_line() -> None:
    """Run ``gradsync ARGS`` and exit with its code; a rank started by torchrun, mpirun or srun
    leaves without interpreter teardown (``tools.launch.leave_launched`` says why).

    Example: ``python -m gradsync list`` calls ``command_line()`` with ``sys.argv`` as it is.
    """
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    leave_launched(code)
    sys.exit(code)
