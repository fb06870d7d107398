"""Sleeping in the kernel until a word of shared memory changes: Linux's futex.

With more ranks than cores (4 ranks on 2 here), a rank that spins while it waits takes the
core from the rank it waits for; one that sleeps on a fixed nap wakes late. A futex sleeps
until a peer that changed the word wakes it (``wake``), with a timeout, so the waiting rank
still checks its peers' lives and its deadline. The word must be 4-byte aligned in a shared
mapping (a shared futex, not FUTEX_PRIVATE). The one way gradsync waits on shared memory: the
barrier of the shared buffers (in C, ``native.c``) and the message channels' doorbells both
sleep here. The calls go through the C extension (``_native``), which is built for the
machine, so no syscall number is looked up here.
"""

from __future__ import annotations

import os

from . import _native


def available() -> bool:
    """Whether futex waits work on this machine: ``available()`` is True on Linux."""
    return os.name == "posix" and hasattr(_native, "futex_wait")


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected``, at most ``timeout_s``
    (returns at once if it already differs; may return early: callers look again).

    Example: ``wait(word_address, seen, 0.01)`` then read the word once more.
    """
    _native.futex_wait(address, expected, int(max(0.0, timeout_s) * 1e9))


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``: ``wake(word_address)``."""
    _native.futex_wake(address)
