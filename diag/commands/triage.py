"""``diag triage PATH``: explain a hang or an NCCL/gloo timeout. Never imports torch."""

from __future__ import annotations

import json
import sys

import click

from diag.trace.loader import TraceError


@click.command("triage")
@click.argument("path", type=click.Path(exists=True))
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all-ranks", is_flag=True, help="List every rank in text output, not only the ones that matter.")
def command(path: str, output_format: str, all_ranks: bool) -> None:
    """Explain why a distributed job hung or timed out.

    PATH is a diag trace directory (written by diag.init, with the hang watchdog on) or a directory of
    PyTorch Flight Recorder dumps (files <prefix><rank> from TORCH_FR_DUMP_TEMP_FILE or
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE, pickle or JSON; pickles are read with a restricted unpickler).

    The verdict is one of missing_ranks, desync, dead_rank, slow, no_problem, with the culprit ranks, the
    collective (process group, sequence number, op, sizes) and the evidence.

    \b
    Examples:
      diag triage traces/run1
      diag triage /tmp/fr_dumps --format json
    """
    from diag.triage.analysis import triage
    from diag.triage.report import format_text
    from diag.triage.sources import read_input

    try:
        verdict = triage(read_input(path))
    except TraceError as exc:
        raise click.ClickException(str(exc)) from exc
    if output_format == "json":
        json.dump(verdict.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        click.echo(format_text(verdict, all_ranks=all_ranks))
