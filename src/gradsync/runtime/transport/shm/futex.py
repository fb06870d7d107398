"""Sleeping in the kernel until a word of shared memory changes: Linux's futex, through ctypes.

With more ranks than cores (4 ranks on 2 here), a rank that spins while it waits takes the
core from the rank it waits for; one that sleeps on a fixed nap wakes late. A futex sleeps
until a peer that changed the word wakes it (``wake``), with a timeout, so the waiting rank
still checks its peers' lives and its deadline. The word must be 4-byte aligned in a shared
mapping (a shared futex, not FUTEX_PRIVATE). Cost here: ``wake`` about 1 us when nobody
sleeps.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

FUTEX_WAIT, FUTEX_WAKE = 0, 1
SYSCALL = {"x86_64": 202, "aarch64": 98}
EVERYONE = 2 ** 31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


@functools.cache
def _syscall():
    """libc's ``syscall`` and this machine's futex number (looked up on first use)."""
    number = SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"no futex syscall number known for {platform.machine()}")
    call = ctypes.CDLL(None, use_errno=True).syscall
    call.restype = ctypes.c_long
    return call, number


def available() -> bool:
    """Whether futex waits work on this machine: ``available()`` is True on Linux x86-64."""
    try:
        _syscall()
    except OSError:
        return False
    return os.name == "posix"


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected``, at most ``timeout_s``
    (returns at once if it already differs; may return early: callers look again).

    Example: ``wait(word_address, seen, 0.01)`` then read the word once more.
    """
    call, number = _syscall()
    seconds = max(0.0, timeout_s)
    spec = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
    call(number, ctypes.c_void_p(address), FUTEX_WAIT, ctypes.c_int32(expected), ctypes.byref(spec), None, 0)


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``: ``wake(word_address)``."""
    call, number = _syscall()
    call(number, ctypes.c_void_p(address), FUTEX_WAKE, EVERYONE, None, None, 0)
