"""The ``diag`` subcommands, one module each, imported only when used (see diag/cli.py)."""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path

import click

from diag.commands.exit_codes import InputError

_SOURCE = Path(__file__).resolve().parents[2]  # the checkout, for an editable install or PYTHONPATH
# pyproject.toml's data-files: where a plain (non-editable) install puts the sample runs and the docs
_SAMPLES_INSTALLED = Path("share", "diag", "sample_traces")
_DOCS_INSTALLED = Path("share", "doc", "diag")
DEFAULT_SAMPLE = "straggler"


def _prefixes() -> list[Path]:
    """Every prefix a plain install may have put data-files under: a venv or system prefix, the user base of
    --user."""
    found = [sysconfig.get_path("data"), sys.prefix, sys.exec_prefix, getattr(site, "USER_BASE", None)]
    return [Path(p) for p in dict.fromkeys(found) if p]


def _candidates(in_source: str, installed: Path) -> list[Path]:
    return [_SOURCE / in_source] + [prefix / installed for prefix in _prefixes()]


def samples_dir() -> Path | None:
    """The folder of the bundled sample runs (the checkout's sample_traces/, or the installed copy), or None."""
    return next((p for p in _candidates("sample_traces", _SAMPLES_INSTALLED) if (p / DEFAULT_SAMPLE).is_dir()), None)


def docs_dir() -> Path | None:
    """The folder of diag's documentation (the checkout's docs/, or the installed copy), or None."""
    return next((p for p in _candidates("docs", _DOCS_INSTALLED) if (p / "analyze.md").is_file()), None)


def sample_run(doing: str) -> Path:
    """The bundled sample run, for commands given no TRACE_DIR; ``doing`` says what, e.g. "analysing"."""
    root = samples_dir()
    if root is None:
        raise InputError(
            "no TRACE_DIR given and the bundled sample runs are not installed (looked in "
            + ", ".join(str(p) for p in _candidates("sample_traces", _SAMPLES_INSTALLED))
            + "); give a trace directory"
        )
    found = root / DEFAULT_SAMPLE
    click.echo(f"No TRACE_DIR given: {doing} the bundled sample run {found} (diag samples lists the others)", err=True)
    return found
