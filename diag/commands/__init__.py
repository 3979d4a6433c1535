"""The ``diag`` subcommands, one module each, imported only when used (see diag/cli.py)."""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path

import click

from diag.commands.exit_codes import InputError

_SAMPLE_RUN_IN_SOURCE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler"
_SAMPLE_RUN_INSTALLED = Path("share", "diag", "sample_traces", "straggler")  # pyproject.toml's data-files


def _sample_run_candidates() -> list[Path]:
    """Where the sample run can be: the source checkout (editable install), then every prefix a plain install
    may have put pyproject.toml's data-files under (a venv or system prefix, the user base of --user)."""
    prefixes = [sysconfig.get_path("data"), sys.prefix, sys.exec_prefix, getattr(site, "USER_BASE", None)]
    return [_SAMPLE_RUN_IN_SOURCE] + [Path(p) / _SAMPLE_RUN_INSTALLED for p in prefixes if p]


def sample_run(doing: str) -> Path:
    """The bundled sample run, for commands given no TRACE_DIR; ``doing`` says what, e.g. "analysing"."""
    candidates = _sample_run_candidates()
    found = next((path for path in candidates if path.is_dir()), None)
    if found is None:
        raise InputError(
            "no TRACE_DIR given and the bundled sample run is not installed (looked in "
            + ", ".join(str(p) for p in candidates)
            + "); give a trace directory"
        )
    click.echo(f"No TRACE_DIR given: {doing} the bundled sample run {found}", err=True)
    return found
