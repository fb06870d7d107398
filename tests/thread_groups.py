"""An all-reduce with every rank a thread of this process, over the in-memory transport."""

import time

from gradsync.runtime.prepare import prepare
from gradsync.runtime.transport.memory import run_threads


def run_group(inputs, algorithm, seed=0, op="sum", **options):
    """Every rank's result (or the exception it raised) of one all-reduce of ``inputs``."""
    def rank(r, transport):
        t = inputs[r].clone()
        prepare(t, algorithm, op, transport, time.monotonic() + 20, options=options).start(True).wait()
        return t

    return run_threads(rank, len(inputs), seed)
