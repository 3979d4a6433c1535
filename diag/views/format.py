"""How every view writes a number: durations, percentages, byte sizes and rates, each with its unit.

The text, markdown and HTML reports and the dashboard all format through these, so a value reads the same
everywhere. Each function names the unit it takes (``ms_from_s`` takes seconds, ``pct`` a fraction) and
writes ``-`` for a value that is not known (None).
"""

from __future__ import annotations

import re

BYTES_PER_MIB = 2**20
BYTES_PER_GIB = 2**30
MISSING = "-"


def ms_from_s(seconds: float | None, digits: int = 1) -> str:
    """Seconds as milliseconds: ``0.0123`` -> ``12.3 ms``."""
    return MISSING if seconds is None else f"{seconds * 1e3:.{digits}f} ms"


def ms_from_us(us: float | None, digits: int = 2) -> str:
    """Microseconds as milliseconds, two decimals by default (collectives often take well under 1 ms):
    ``1234`` -> ``1.23 ms``."""
    return MISSING if us is None else f"{us / 1e3:.{digits}f} ms"


def s_from_s(seconds: float | None, digits: int = 1) -> str:
    """Seconds: ``12.34`` -> ``12.3 s``."""
    return MISSING if seconds is None else f"{seconds:.{digits}f} s"


def pct(fraction: float | None, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage: ``0.123`` -> ``12.3%`` (``+12%`` with ``signed`` and no digits)."""
    if fraction is None:
        return MISSING
    return f"{100 * fraction:{'+' if signed else ''}.{digits}f}%"


def pct_from_pct(percent: float | None, digits: int = 1) -> str:
    """A value that is already a percentage: ``12.34`` -> ``12.3%``."""
    return MISSING if percent is None else f"{percent:.{digits}f}%"


def gib(nbytes: float | None, digits: int = 2) -> str:
    """Bytes in GiB: ``3 * 2**30`` -> ``3.00 GiB``."""
    return MISSING if nbytes is None else f"{nbytes / BYTES_PER_GIB:.{digits}f} GiB"


def mib(nbytes: float | None, digits: int = 2, signed: bool = False) -> str:
    """Bytes in MiB: ``2**20`` -> ``1.00 MiB`` (``+1.00 MiB`` with ``signed``, for growth)."""
    if nbytes is None:
        return MISSING
    return f"{nbytes / BYTES_PER_MIB:{'+' if signed else ''}.{digits}f} MiB"


def iec_bytes(nbytes: float) -> str:
    """Bytes in the largest binary unit below 1024 of it: ``512`` -> ``512 B``, ``3 * 2**20`` -> ``3 MiB``,
    whole numbers up to GiB, one decimal in TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def size(nbytes: float | None) -> str:
    """Bytes of any size: in GiB with two decimals from 1 GiB up, else in the largest unit below 1024 of it
    (``33540`` -> ``33 KiB``): model states of a small model and of a large one in the same column."""
    if nbytes is None:
        return MISSING
    return gib(nbytes) if abs(nbytes) >= BYTES_PER_GIB else iec_bytes(nbytes)


def rate(value: float | None, what: str, digits: int = 0) -> str:
    """A rate per second with thousands separators: ``rate(12345.6, "tokens")`` -> ``12,346 tokens/s``."""
    return MISSING if value is None else f"{value:,.{digits}f} {what}/s"


def num(value, fmt: str = "{:.1f}") -> str:
    """Any other number through a format string; ``-`` when unknown."""
    return MISSING if value is None else fmt.format(value)


def count(value: float | None) -> str:
    """A large count in words of thousands: ``7e9`` -> ``7.00B``, ``117549056`` -> ``117.5M``, ``8385`` -> ``8,385``."""
    if value is None:
        return MISSING
    for scale, suffix, digits in ((1e12, "T", 2), (1e9, "B", 2), (1e6, "M", 1)):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}f}{suffix}"
    return f"{value:,.0f}"


# C0 controls but tab and newline, DEL, C1 controls (ESC starts CSI/OSC sequences: a window title, a clipboard
# write (OSC 52), a cleared screen, hidden text; U+009B is a one-character CSI), and the bidirectional overrides
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """A string from a trace file (a run id, host, device or group name, an error message) safe to print on a
    terminal: every control character written as its escape (``\\x1b``), so nothing in a file can move the
    cursor, retitle the window or write to the clipboard, and the reader still sees that it was there."""
    return _CONTROL_RE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
