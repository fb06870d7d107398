"""Progress engines: one thread per process group runs the group's collectives in order.

Collectives run one after another, in the order they were started, on one progress thread per
process group, so the caller's thread (a DDP backward pass) goes on while the data moves; a
blocking call with nothing queued runs in the caller's own thread instead, saving the
hand-over. As with torch.distributed, every rank starts its collectives in the same order, from
one thread: two threads of a rank starting collectives at once could run them at the same
time, and equal descriptions post equal tags.

Each group's engine is kept in the group's state (``runtime.state``), which bounds how many
groups a process keeps; an engine dropped there stops its thread.
"""

from __future__ import annotations

import atexit
import functools
import queue
import threading

import torch

from .state import STATE, group_state

_STOP = object()
JOIN_S = 2.0                     # how long closing waits for a thread to finish what it has queued
SLOT = "progress"                # the group state's slot holding a group's engine


@functools.cache
def _stop_at_exit() -> None:
    """Stop every group's progress thread when the process exits, before the interpreter kills
    daemon threads: one killed while it runs torch's C++ (a future's completion) ends the process
    in std::terminate ("terminate called without an active exception", exit code -6).
    Registered by the first thread's start (once: the cache holds its one call), not at import."""
    atexit.register(lambda: [engine.close() for engine in STATE.objects(SLOT)])


class Progress:
    """One group's progress thread: runs its queued collectives in order, completing their
    futures. ``running`` is held by whoever runs one of the group's collectives (this thread,
    or a caller running one inline), so two never run at once.

    Example: ``Progress().submit(job, torch.futures.Future())`` runs ``job.complete(future)``
    on the engine's thread.
    """

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self.queued = 0                 # collectives queued or running (read directly on the hot path)
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self._stopping = False         # a stop is queued for the current thread
        self.running = threading.RLock()

    def busy(self) -> bool:
        """Whether a collective is queued or running (the group state keeps a busy group)."""
        return self.queued > 0

    def on_thread(self) -> bool:
        """Whether the caller is this progress thread (a future's callback, run on completion)."""
        return threading.current_thread() is self.thread

    def submit(self, job, future: torch.futures.Future) -> None:
        with self._lock:
            self.queued += 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="gradsync-progress", daemon=True)
                self.thread.start()
                self._stopping = False
                _stop_at_exit()
        self._queue.put((job, future))

    def close(self) -> None:
        """Stop the thread once its queue is done (the group was dropped from the state, or the
        process exits), waiting up to JOIN_S for it: a thread still alive when the interpreter
        finalizes is killed wherever it is."""
        with self._lock:
            thread = self.thread
            if thread is not None and thread.is_alive() and not self._stopping:
                self._queue.put((_STOP, None))
                self._stopping = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    def _loop(self):
        while True:
            job, future = self._queue.get()
            if job is _STOP:
                return
            try:
                with self.running:
                    job.complete(future)
            finally:
                with self._lock:
                    self.queued -= 1


def progress_for(transport) -> Progress:
    """The progress engine of ``transport``'s group (its ``group_key``), made on first use."""
    return group_state(transport.group_key).slot(SLOT, Progress)


def start(job, transport, inline: bool = False) -> torch.futures.Future:
    """Run ``job`` (anything with ``complete(future)``) on ``transport``'s progress engine, in
    start order with the group's other collectives; return the future ``job`` completes.
    ``inline``: in this thread when nothing is queued (and always from the engine's own thread:
    a callback's call runs after the current one). Example: ``start(collective, transport).wait()``.
    """
    future = torch.futures.Future()
    engine = progress_for(transport)
    if engine.on_thread() or (inline and not engine.busy()):
        with engine.running:
            job.complete(future)
    else:
        engine.submit(job, future)
    return future
