"""Parse and format sizes, bandwidths and durations.

Decimal units as D2L's arithmetic uses them: 1 MB = 10**6 bytes, 1 GB/s = 10**9 bytes/s.
Binary units (KiB, MiB, GiB) and bits (Mbit, Gbit) are accepted too.
"""

import re

from .errors import ConfigError

_PREFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE = re.compile(_NUMBER + r"\s*(|k|K|M|G|T|Ki|Mi|Gi|Ti)(B|bit|b)?$")
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _parse(text, what: str, example: str, rate: bool) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        if rate:
            s = re.sub(r"(/s|ps)$", "", s)
        m = _SIZE.match(s)
        if not m:
            raise ConfigError(f"bad {what} {text!r}: expected a number with a unit, like {example}")
        number, prefix, unit = m.groups()
        value = float(number) * _PREFIX[prefix] / (8 if unit in ("bit", "b") else 1)
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"bad {what} {text!r}: expected a finite number >= 0, like {example}")
    return value


def parse_size(text) -> int:
    """Return a byte count from ``"160MB"``, ``"4KiB"``, ``"1e6"`` or an int.

    >>> parse_size("160MB")
    160000000
    """
    value = _parse(text, "size", "160MB or 4KiB", rate=False)
    if abs(value - round(value)) > 1e-9 * max(value, 1.0):
        raise ConfigError(f"bad size {text!r}: {value:g} bytes is not a whole number of bytes")
    return int(round(value))


def parse_bandwidth(text) -> float:
    """Return bytes per second from ``"16GB/s"``, ``"100Mbit"`` or a number of bytes/s.

    >>> parse_bandwidth("100Mbit")
    12500000.0
    """
    value = _parse(text, "bandwidth", "16GB/s or 100Mbit", rate=True)
    if value <= 0:
        raise ConfigError(f"bad bandwidth {text!r}: must be > 0")
    return value


def parse_time(text) -> float:
    """Return seconds from ``"2us"``, ``"1.5ms"``, ``"0"`` or a number of seconds.

    >>> parse_time("2us")
    2e-06
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.match(_NUMBER + r"\s*(s|ms|us|µs|ns)?$", str(text).strip())
        if not m:
            raise ConfigError(f"bad duration {text!r}: expected a number with a unit, like 2us or 1.5ms")
        value = float(m.group(1)) * _TIME[m.group(2) or "s"]
    if not 0 <= value < float("inf"):
        raise ConfigError(f"bad duration {text!r}: expected a finite number >= 0")
    return value


def format_time(seconds: float) -> str:
    """Format seconds with a readable unit: ``format_time(0.06) == '60.0 ms'``."""
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}" if seconds / scale < 1000 else f"{seconds / scale:.0f} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_size(nbytes: float) -> str:
    """Format bytes in decimal units: ``format_size(160e6) == '160 MB'``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:.0f} B"
