"""Chrome trace files (the JSON trace event format ui.perfetto.dev and chrome://tracing open) of
measured and simulated collectives, laid out alike so that the two open side by side.

Layout, the same for a measured run (``gradsync.runtime.tracing``) and a simulated one
(``from_simulation``):

- one process (``pid``) per rank, named "rank r", with one thread (``tid`` 0);
- on it a slice per collective ("all_reduce ring", category ``collective``), inside it a slice
  per round ("round r", category ``round``, args ``round``), and inside those a slice per
  transfer event (category ``transfer``): ``send`` (posting a send), ``recv wait`` (waiting
  for a receive to arrive), ``send wait`` (waiting for sends to complete), ``reduce`` (adding
  a received piece in), each with ``bytes``, ``peer`` and ``round`` as args;
- simulated runs add a process "links" with a counter track per busy link: its utilisation
  (0 to 1) over time.

Times are microseconds ("X" complete events: ``ts`` and ``dur``); "M" metadata events name the
processes and threads; "C" events are counters. ``validate`` checks a file against this and
against the format's rule that slices of one thread nest. ``structure`` reduces a trace to what
does not depend on timing (per rank and round: bytes per transfer kind and peer), so a measured
and a simulated trace of one schedule compare equal; ``compare`` sets their rounds' times side
by side.

The modules: ``simulated`` builds a simulated run's trace; ``reading`` checks, reads,
compares and merges traces; the events themselves are written by ``gradsync.core.trace_events``.

>>> from gradsync.algorithms import ring
>>> from gradsync.model.simulate import simulate
>>> from gradsync.model.topology import preset
>>> t = from_simulation(simulate(ring.schedule(4, 1000), preset("ethernet", 4)))
>>> validate(t); len(structure(t)[0])
6
"""

from ...core.trace_events import (METADATA, STRUCTURAL, TRANSFER_KINDS, complete, document, metadata,
                                  round_slices)
from .reading import collectives, compare, load, merge, round_times, structure, validate
from .simulated import STEPS_LIMIT, check_size, from_simulation

__all__ = ["METADATA", "STEPS_LIMIT", "STRUCTURAL", "TRANSFER_KINDS", "check_size", "collectives", "compare",
           "complete", "document", "from_simulation", "load", "merge", "metadata", "round_slices", "round_times",
           "structure", "validate"]
