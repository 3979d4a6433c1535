"""``diag export``: a trace directory in other tools' formats. Never imports torch."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("export")
@click.argument("trace_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--perfetto",
    "perfetto_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a Chrome trace event JSON file that ui.perfetto.dev and chrome://tracing open.",
)
@click.option("--steps", metavar="A:B", help="Only steps A <= step < B (large runs make large files).")
@click.option("--ranks", metavar="R1,R2,...", help="Only these ranks.")
def command(trace_dir, perfetto_path, steps, ranks):
    """Export all ranks of TRACE_DIR to one aligned timeline: steps, phases, collectives per process group,
    pipeline micro-batches and GPU telemetry counters.

    \b
    Example:
      diag export traces/run1 --perfetto run1.json --steps 100:110
      then open run1.json in https://ui.perfetto.dev
    """
    from diag.analysis.window import parse_step_range
    from diag.trace.loader import TraceError
    from diag.views.perfetto import write_chrome_trace_dir

    try:
        step_range = parse_step_range(steps) if steps else None
        rank_list = [int(r) for r in ranks.split(",")] if ranks else None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if step_range is not None:
        step_range = (step_range[0] or 0, step_range[1] if step_range[1] is not None else 2**62)
    try:
        # rank by rank: memory holds one rank's tables, and time follows the steps asked (docs/benchmarks.md)
        count, written, skipped = write_chrome_trace_dir(trace_dir, perfetto_path, step_range, rank_list, progress=True)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from exc
    for note in skipped:
        click.echo(f"skipped: {note}", err=True)
    click.echo(f"{count} events from {len(written)} ranks written to {perfetto_path}", err=True)
