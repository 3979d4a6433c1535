"""The one progress bar of every command (loading ranks, reducing them, exporting them, triage's reads).

A bar is drawn on stderr only for a person watching: when stderr is a terminal, ``--quiet`` was not given and
the work is long enough to need one (more than MIN_ITEMS ranks: fewer load in about a second). On a pipe, in a
file or in CI nothing is written, so a log or a redirected report holds no carriage returns. Callers ask for a
bar and always get an object with ``update(n)`` and ``close()``; when none is drawn it does nothing."""

from __future__ import annotations

import os
import sys

MIN_ITEMS = 64

_quiet = False


def set_quiet(quiet: bool) -> None:
    """``--quiet``: no bar for the rest of this process."""
    global _quiet
    _quiet = bool(quiet)


def drawn(stream=None) -> bool:
    """Whether bars are drawn on ``stream`` (stderr by default): a terminal, and not quiet."""
    stream = sys.stderr if stream is None else stream
    try:
        return not _quiet and stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class NoBar:
    """What a caller holds when no bar is drawn."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(total: int, desc: str, unit: str = "rank", min_items: int = MIN_ITEMS):
    """A bar over ``total`` items on stderr, or a NoBar (see the module's docstring)."""
    if total <= min_items or not drawn():
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, **_size_options(sys.stderr))


def _size_options(stream) -> dict:
    """Follow the terminal's width; a terminal that reports no size (0 x 0: ``script``, some CI and container
    consoles) gets 80 x 24, where tqdm would otherwise draw nothing at all."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        size = os.terminal_size((0, 0))
    if size.columns and size.lines:
        return {"dynamic_ncols": True}
    return {"ncols": 80, "nrows": 24}
