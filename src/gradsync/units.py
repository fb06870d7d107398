"""Parse and format sizes, bandwidths and durations.

Sizes of data are bytes, however the unit is spelled: ``4kb``, ``4KB``, ``4k`` and ``4000``
are 4000 bytes; ``4KiB`` and ``4Ki`` are 4096 (decimal or binary as spelled, decimal as in
D2L's arithmetic: 1 MB = 10**6 bytes). Bits are taken only for a rate spelled so:
``100Mbit``, ``1Gbit/s``, ``100Mbps`` (bandwidths otherwise in bytes/s, 1 GB/s = 10**9 bytes/s).
A size is shown the way it was most likely given: in decimal units when it is a round
number of them, in binary ones when it is a round number of those.

>>> parse_size("4kb"), parse_size("4KiB"), parse_bandwidth("1Gbit/s"), format_size(parse_size("1MiB"))
(4000, 4096, 125000000.0, '1 MiB')
"""

import re

from .errors import ConfigError

_DECIMAL = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(_NUMBER + r"\s*([kKmMgGtT]i?)?\s*(B|b|bytes?|bits?|bps|Bps)?$")
_BITS = ("bit", "bits", "bps")
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _parse(text, what: str, example: str, rate: bool) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        if rate:
            s = re.sub(r"\s*/\s*s$", "", s)
        m = _QUANTITY.match(s)
        if not m:
            raise ConfigError(f"bad {what} {text!r}: expected a number with a unit, like {example}")
        number, prefix, unit = m.groups()
        prefix = (prefix or "").lower()
        scale = _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix]
        if unit in _BITS and not rate:
            raise ConfigError(f"bad {what} {text!r}: sizes are in bytes (4KB, 4KiB); bits are for rates "
                              f"(100Mbit/s)")
        if unit == "b" and rate:
            raise ConfigError(f"bad {what} {text!r}: say bits or bytes, like 100Mbit/s or 100MB/s")
        value = float(number) * scale / (8 if unit in _BITS else 1)
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"bad {what} {text!r}: expected a finite number >= 0, like {example}")
    return value


def parse_size(text) -> int:
    """Return a byte count from ``"160MB"``, ``"4kb"``, ``"4KiB"``, ``"1e6"`` or an int (bytes).

    >>> parse_size("160MB"), parse_size("4k"), parse_size("2MiB")
    (160000000, 4000, 2097152)
    """
    value = _parse(text, "size", "160MB or 4KiB (bytes)", rate=False)
    if abs(value - round(value)) > 1e-9 * max(value, 1.0):
        raise ConfigError(f"bad size {text!r}: {value:g} bytes is not a whole number of bytes")
    return int(round(value))


def parse_bandwidth(text) -> float:
    """Return bytes per second from ``"16GB/s"``, ``"100Mbit"``, ``"1Gbit/s"`` or a number of bytes/s.

    >>> parse_bandwidth("100Mbit"), parse_bandwidth("2GB/s")
    (12500000.0, 2000000000.0)
    """
    value = _parse(text, "bandwidth", "16GB/s or 100Mbit/s", rate=True)
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


def _round_in(nbytes: float, units) -> str | None:
    """``nbytes`` in the largest of ``units`` it is a round number (at most 4 digits) of, else None."""
    for unit, scale in units:
        if nbytes >= scale:
            value = nbytes / scale
            shown = float(f"{value:.4g}")
            return f"{shown:g} {unit}" if abs(shown - value) <= 1e-9 * value else None
    return None


def format_size(nbytes: float) -> str:
    """Format bytes as they were most likely given: in the units, decimal or binary, in which the
    count is the shorter round number (``format_size(160e6) == '160 MB'``, ``format_size(4096) == '4 KiB'``).

    >>> format_size(160e6), format_size(1 << 20), format_size(1234567), format_size(160)
    ('160 MB', '1 MiB', '1.235 MB', '160 B')
    """
    if nbytes < 1000:
        return f"{nbytes:.0f} B"
    decimal = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
    binary = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    exact = [text for text in (_round_in(nbytes, decimal), _round_in(nbytes, binary)) if text]
    if exact:
        return min(exact, key=len)             # 4096 B is '4 KiB' rather than '4.096 KB'
    for unit, scale in decimal:
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:.0f} B"
