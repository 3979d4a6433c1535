"""The exit status of every ``diag`` command, so that CI can act on it (documented in README.md):

* ``OK`` (0): the command did its work and found no problem;
* ``PROBLEM`` (1): it found one: ``diag analyze`` a finding at or above ``--fail-on``, ``diag triage`` a verdict
  other than no_problem, ``diag compare`` a regression;
* ``USAGE`` (2): it could not do its work: bad options (click's own usage errors are 2 as well), a path that does
  not exist, a trace with nothing usable in it, an output that cannot be written.

A command never ends with 1 for an error, so "1" always means "look at the result"."""

from __future__ import annotations

import click

OK = 0
PROBLEM = 1
USAGE = 2


class InputError(click.ClickException):
    """An error the user can act on (a missing path, nothing usable, an unwritable output): ``Error: ...`` on
    stderr, exit status USAGE."""

    exit_code = USAGE

    def __init__(self, message: str):
        from diag.views.format import printable

        # the message may quote a file (a JSON parser shows the bytes around its error): nothing in it may
        # retitle the window, write the clipboard or clear the screen
        super().__init__(printable(message))


def require_extra(part: str, what: str) -> None:
    """diag.extras.require for a command: a missing optional package is an InputError (exit status USAGE)."""
    from diag.extras import MissingExtra, require

    try:
        require(part, what)
    except MissingExtra as exc:
        raise InputError(str(exc)) from exc
