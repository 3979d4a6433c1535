"""Colour on a terminal, in one place: the severities of analyze's findings and triage's verdict.

Colour is added last, to text the views already made safe (control characters from trace files replaced), and
only when it is wanted: the stream is a terminal, ``NO_COLOR`` is not set (https://no-color.org) and ``TERM`` is
not ``dumb``. Redirected to a file or a pipe, the text is the same bytes as before."""

from __future__ import annotations

import os
import re
import sys

# "1. [high] rank 2 is a straggler ..." as views/text.py writes a finding; markdown is never coloured
_SEVERITY_TAG_RE = re.compile(r"^(\d+\. )\[(high|medium|low)\]", re.MULTILINE)
_SEVERITY_STYLE = {"high": {"fg": "red", "bold": True}, "medium": {"fg": "yellow"}, "low": {"fg": "cyan"}}
# the headline of diag triage's text, up to its colon: "HANG: rank 1 never reached ...", "NO PROBLEM FOUND: ..."
_VERDICT_RE = re.compile(r"\A([^:\n]+)(?=:)")


def colour_wanted(stream=None) -> bool:
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint_severities(text: str) -> str:
    """``[high]``, ``[medium]``, ``[low]`` of each numbered finding in its colour."""
    import click

    return _SEVERITY_TAG_RE.sub(
        lambda m: m.group(1) + click.style(f"[{m.group(2)}]", **_SEVERITY_STYLE[m.group(2)]), text
    )


def paint_verdict(text: str, problem: bool) -> str:
    """The verdict of triage's headline: red for a hang, green for none."""
    import click

    return _VERDICT_RE.sub(
        lambda m: click.style(m.group(1), fg="red" if problem else "green", bold=True), text, count=1
    )
