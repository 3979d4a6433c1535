"""``diag export``: a trace directory in other tools' formats. Never imports torch."""

from __future__ import annotations

from pathlib import Path

import click

from diag.commands._options import parse_steps, quiet_option
from diag.commands.exit_codes import InputError


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
@quiet_option
def command(trace_dir, perfetto_path, steps, ranks, quiet):
    """Export all ranks of TRACE_DIR to one aligned timeline: each rank's steps with their phases nested inside,
    collectives per process group (measured, or estimated and marked so) linked across ranks by flows, pipeline
    micro-batches and GPU telemetry counters.

    \b
    Exit status: 0 written, 2 bad options or nothing to export (the folder of the output is created).

    \b
    Example:
      diag export traces/run1 --perfetto out/run1.json --steps 100:110
      then open out/run1.json in https://ui.perfetto.dev
    """
    from diag.progress import set_quiet
    from diag.trace.loader import TraceError, find_rank_dirs
    from diag.views.format import printable
    from diag.views.perfetto import write_chrome_trace_dir

    set_quiet(quiet)
    step_range = parse_steps(steps)
    rank_list = _parse_ranks(ranks)
    if step_range is not None:
        step_range = (step_range[0] or 0, step_range[1] if step_range[1] is not None else 2**62)
    if rank_list is not None:
        present = set(find_rank_dirs(trace_dir))
        absent = sorted(set(rank_list) - present)
        if absent:
            raise InputError(
                printable(
                    f"--ranks {ranks}: {trace_dir} has no rank {', '.join(map(str, absent))} "
                    f"(it has {_ranks_text(sorted(present))})"
                )
            )
    try:
        perfetto_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(printable(f"cannot create the folder of {perfetto_path}: {exc}")) from exc
    try:
        # rank by rank: memory holds one rank's tables, and time follows the steps asked (docs/benchmarks.md)
        count, written, skipped = write_chrome_trace_dir(
            trace_dir, perfetto_path, step_range, rank_list, progress=True, require_events=True
        )
    except TraceError as exc:
        raise InputError(printable(str(exc))) from exc
    except OSError as exc:
        raise InputError(printable(f"cannot write {perfetto_path}: {exc}")) from exc
    # names, paths and messages from the trace's files: no control character reaches the terminal
    for note in skipped:
        click.echo(printable(f"skipped: {note}"), err=True)
    if not quiet:
        click.echo(printable(f"{count} events from {len(written)} ranks written to {perfetto_path}"), err=True)


def _parse_ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        ranks = [int(r) for r in text.split(",") if r.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: give rank numbers R1,R2,... (e.g. 0,3)", param_hint="--ranks") from exc
    if not ranks or min(ranks) < 0:
        raise click.BadParameter(f"{text!r}: give rank numbers R1,R2,... (e.g. 0,3)", param_hint="--ranks")
    return ranks


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "no rank directory"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:20])) + (" ..." if len(ranks) > 20 else "")
