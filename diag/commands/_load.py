"""``diag.analysis.runs`` for a command: a run that cannot be analysed is a usage error (exit status 2) saying
why. Never imports torch."""

from __future__ import annotations

from pathlib import Path

from diag.commands.exit_codes import InputError


def analysed(path: Path, **options):
    """``diag.analysis.runs.analysed``; its RunError an InputError."""
    from diag.analysis.runs import RunError
    from diag.analysis.runs import analysed as analysed_run

    try:
        return analysed_run(path, **options)
    except RunError as exc:
        raise InputError(str(exc)) from exc


def load_summary(path: Path, label: str, *options, **named):
    """``diag.analysis.runs.load_summary``; its RunError an InputError."""
    from diag.analysis.runs import RunError
    from diag.analysis.runs import load_summary as load_run_summary

    try:
        return load_run_summary(path, label, *options, **named)
    except RunError as exc:
        raise InputError(str(exc)) from exc
