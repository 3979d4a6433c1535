"""The ``diag`` subcommands, one module each, imported only when used (see diag/cli.py)."""

from __future__ import annotations

from pathlib import Path

import click

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler"


def sample_run(doing: str) -> Path:
    """The bundled sample run, for commands given no TRACE_DIR; ``doing`` says what, e.g. "analysing"."""
    if not SAMPLE_RUN.is_dir():
        raise click.ClickException(
            f"no TRACE_DIR given and the bundled sample run {SAMPLE_RUN} is not there; give a trace directory"
        )
    click.echo(f"No TRACE_DIR given: {doing} the bundled sample run {SAMPLE_RUN}", err=True)
    return SAMPLE_RUN
