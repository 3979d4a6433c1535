"""Values read from JSON files diag wrote, which anyone could have edited: each function gives the value in
the type the reader expects, or None where it is something else (never an exception). Used by the manifest,
the watchdog's records, events.jsonl rows, Kineto metadata and Flight Recorder entries."""

from __future__ import annotations

import math

from diag.trace.schema import MAX_RANK

MAX_TEXT_CHARS = 4096  # a host name or version longer than this is not one


def finite(value) -> float | None:
    """A finite number (not a bool, not NaN or infinite) as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def whole(value) -> int | None:
    """A whole number (5 or 5.0) as an int."""
    number = finite(value)
    return int(number) if number is not None and number.is_integer() else None


def micros(value) -> int | None:
    """A wall-clock instant or span in microseconds (written as an integer; a float is rounded down)."""
    number = finite(value)
    return int(number) if number is not None else None


def positive_number(value) -> float | None:
    number = finite(value)
    return number if number is not None and number > 0 else None


def positive_int(value) -> int | None:
    number = whole(value)
    return number if number is not None and number > 0 else None


def text(value) -> str | None:
    """A non-empty string, at most MAX_TEXT_CHARS; a whole number is taken as its digits (a host or run id)."""
    if isinstance(value, str):
        return value[:MAX_TEXT_CHARS] if value else None
    number = whole(value)
    return None if number is None else str(number)


def mapping(value) -> dict | None:
    return value if isinstance(value, dict) else None


def as_rank(value) -> int | None:
    """A rank (or index): a whole number from 0 to MAX_RANK, also written as digits; else None (never a
    10**10-long range)."""
    number = whole(value)
    if number is None and isinstance(value, str) and len(value) < 20 and value.strip().isdigit():
        number = int(value)
    return number if number is not None and 0 <= number <= MAX_RANK else None


INT64_MAX = 2**63 - 1


def int64(value) -> int | None:
    """A whole number that an int64 column holds (5, 5.0; not 10**30, not 1e300)."""
    number = whole(value)
    return number if number is not None and -INT64_MAX <= number <= INT64_MAX else None


def time_us(value) -> int | None:
    """An instant or span in microseconds that an int64 holds (a float is rounded down)."""
    number = micros(value)
    return number if number is not None and -INT64_MAX <= number <= INT64_MAX else None


def scalar(value) -> str | int | float | bool | None:
    """A value an event may carry in a column of its own: text (at most MAX_TEXT_CHARS), a finite number, a
    boolean; None for containers, NaN, infinities."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return value[:MAX_TEXT_CHARS]
    if isinstance(value, int):
        return value if -INT64_MAX <= value <= INT64_MAX else None
    return finite(value)
