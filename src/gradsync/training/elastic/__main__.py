"""``python -m gradsync.training.elastic DIR``: one elastic worker, as torchrun's agent starts it;
``... DIR --check`` checks ``DIR/config.json`` and exits (2 on a bad one) before agents start."""

import sys
from pathlib import Path

from ...errors import ConfigError
from ...tools.launch import leave_launched
from .job import read_config
from .worker import worker

if len(sys.argv) == 3 and sys.argv[2] == "--check":     # check DIR/config.json before starting agents
    try:
        print(f"ok: {read_config(Path(sys.argv[1]))}")
    except ConfigError as e:
        print(f"gradsync: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
worker(Path(sys.argv[1]))
# Leave without interpreter teardown, where a Gloo thread can abort a finished worker (about
# one run in six here) and torchrun would restart a finished group: see leave_launched.
leave_launched(0)
