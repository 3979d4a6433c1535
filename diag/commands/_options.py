"""Options several commands share, checked in one place: step ranges, intervals in seconds, --quiet, --workers."""

from __future__ import annotations

import math

import click


def parse_steps(text: str | None) -> tuple[int | None, int | None] | None:
    """``--steps A:B`` as (A, B), B exclusive; a usage error (exit status 2) for text that is not a range, or a
    range with no step in it (``50:10``, ``10:10``)."""
    from diag.analysis.window import parse_step_range

    try:
        step_range = parse_step_range(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--steps") from exc
    if step_range is not None and None not in step_range and step_range[1] <= step_range[0]:
        raise click.BadParameter(
            f"{text!r} holds no step: A:B means A <= step < B, so B must be above A", param_hint="--steps"
        )
    return step_range


class Seconds(click.ParamType):
    """A finite number of seconds in [min_s, max_s]: not nan, not inf, and never 0 or below, which would make
    a polling loop spin a core at 100%."""

    name = "seconds"

    def __init__(self, min_s: float, max_s: float):
        self.min_s, self.max_s = min_s, max_s

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not self.min_s <= seconds <= self.max_s:
            self.fail(f"{value!r} is not a number of seconds in [{self.min_s:g}, {self.max_s:g}]", param, ctx)
        return seconds

    def get_metavar(self, param, ctx=None):
        return "SECONDS"


class Finite(click.FloatRange):
    """A finite number within click's range bounds. FloatRange alone lets nan through (nan compares false with
    every bound) and inf past an open upper end: a peak of nan TFLOP/s ended in a traceback, one of inf read
    as 0% MFU."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


POLL_MIN_S = 0.1  # below this a poll re-reads files faster than anything writes them
POLL_MAX_S = 24 * 3600.0  # Event.wait and time.sleep refuse much larger values (OverflowError)


def poll_seconds() -> Seconds:
    return Seconds(POLL_MIN_S, POLL_MAX_S)


def quiet_option(command):
    """``-q/--quiet``: no progress bar and no notes on stderr (errors are still said)."""
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        help="No progress bar or notes on stderr (errors still are). Bars are drawn only when stderr is a terminal.",
    )(command)


class WorkerCount(click.ParamType):
    """``--workers N``: a whole number of worker processes, at least 1."""

    name = "workers"

    def convert(self, value, param, ctx):
        try:
            workers = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number of worker processes", param, ctx)
        if workers < 1:
            self.fail(f"{value!r}: give 1 or more worker processes (1 runs everything in this process)", param, ctx)
        return workers

    def get_metavar(self, param, ctx=None):
        return "N"


def workers_option(command):
    """``--workers N``: the worker processes that read and reduce a large trace's ranks (``diag.processes``)."""
    return click.option(
        "--workers",
        type=WorkerCount(),
        default=None,
        help="Worker processes that read the ranks (1: everything in this process, e.g. on a busy machine). "
        "Default: one per core this process may use, at most 4, from 512 ranks; in this process below that.",
    )(command)
