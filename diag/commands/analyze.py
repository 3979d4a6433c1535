"""``diag analyze``: what slows the job down, and by how much. Never imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diag.commands import sample_run
from diag.commands._options import Finite, parse_steps, quiet_option, workers_option
from diag.commands.exit_codes import PROBLEM, InputError, require_extra
from diag.processes import PARTITIONED_MIN_RANKS
from diag.views.colour import colour_wanted, paint_severities

FAIL_ON = ("high", "medium", "low", "never")


@click.command("analyze")
@click.argument("trace_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="Output format on stdout.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write a self-contained HTML report with figures.",
)
@click.option(
    "--steps", "steps", metavar="A:B", help="Analyse steps A <= step < B (default: all complete steps after warm-up)."
)
@click.option(
    "--peak-tflops",
    type=Finite(min=0, min_open=True),
    help="Dense peak TFLOP/s per GPU for MFU (overrides the manifest and the datasheet table).",
)
@click.option(
    "--flops-per-step",
    type=Finite(min=0, min_open=True),
    help="Model FLOPs of one step on one rank (overrides the manifest).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Do not read or write the cache in TRACE_DIR/.diag-cache (loaded tables and reports).",
)
@click.option(
    "--partitioned/--in-memory",
    "partitioned",
    default=None,
    help="Reduce the collectives rank by rank in bounded memory, or load them whole "
    f"(default: rank by rank above {PARTITIONED_MIN_RANKS} ranks or with --scheduler). See diag docs scale.",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Run the per-rank reduction on this Dask cluster (tcp://host:8786); its workers read TRACE_DIR "
    "themselves, so it must be on a filesystem they share. Needs pip install 'dask[distributed]'.",
)
@workers_option
@click.option(
    "--fail-on",
    type=click.Choice(FAIL_ON),
    default="high",
    show_default=True,
    help="Exit with status 1 when a finding of this severity or above was found ('never': 0 whatever was "
    "found), so that CI can stop on a real problem.",
)
@quiet_option
def command(
    trace_dir,
    fmt,
    html_path,
    steps,
    peak_tflops,
    flops_per_step,
    no_cache,
    partitioned,
    scheduler,
    workers,
    fail_on,
    quiet,
):
    """Analyse a trace directory: stragglers, MFU, communication, memory and GPU telemetry,
    with findings ranked by the time each one costs. TRACE_DIR may also be a directory of
    torch.profiler (Kineto) traces, one *.json or *.json.gz per rank: GPU time is then split
    into compute, communication, memory copies and idle (see diag docs kineto).

    Exit status: 0 no finding at or above --fail-on, 1 at least one, 2 bad options or nothing to analyse
    (TRACE_DIR missing or unusable, no step in --steps).

    \b
    Examples:
      diag analyze traces/run1
      diag analyze profiler_traces/    (torch.profiler *.pt.trace.json files)
      diag analyze traces/run1 --steps 100:500 --format json > report.json
      diag analyze traces/run1 --html report.html --peak-tflops 989
      diag analyze traces/run1 --fail-on medium --quiet   (in CI: exit 1 on a medium or high finding)
      diag analyze traces/run16k --workers 1   (a busy machine: read every rank in this process)
      diag analyze                     (the bundled sample run)
    """
    from diag.commands._load import analysed
    from diag.progress import set_quiet
    from diag.views import render

    set_quiet(quiet)
    if workers is not None and scheduler is not None:
        raise click.UsageError("--workers sets this machine's worker processes; with --scheduler the Dask cluster's "
                               "workers reduce the ranks: give one of them")  # fmt: skip
    if html_path is not None:  # before the analysis, which may take minutes
        require_extra("html", "--html")
    step_range = parse_steps(steps)
    if trace_dir is None:
        trace_dir = sample_run("analysing")
        no_cache = True  # small, and part of the installed package: write nothing next to it
    elif not trace_dir.exists():
        raise InputError(f"{trace_dir} does not exist; give the trace directory diag.init wrote")
    report = analysed(
        trace_dir,
        steps=steps,
        step_range=step_range,
        peak_tflops=peak_tflops,
        flops_per_step=flops_per_step,
        no_cache=no_cache,
        partitioned=partitioned,
        scheduler=scheduler,
        workers=workers,
        quiet=quiet,
    ).report
    if steps is not None and not report.run.window.steps_analysed:
        raise InputError(
            f"no complete step of {trace_dir} in --steps {steps} (A <= step < B): the run recorded "
            f"{report.run.window.steps_recorded} steps; give a range inside them, or leave --steps out"
        )
    text = render(report, fmt)
    if fmt == "text" and colour_wanted():
        text = paint_severities(text)
    click.echo(text)
    if html_path is not None:
        from diag.views.html import render_html

        try:
            html_path.write_text(render_html(report), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {html_path}: {exc}") from exc
        if not quiet:
            click.echo(f"HTML report written to {html_path}", err=True)
    failing = findings_at_or_above(report.findings, fail_on)
    if failing:
        if not quiet:
            click.echo(f"{len(failing)} finding(s) at or above --fail-on {fail_on}: exit status {PROBLEM}", err=True)
        sys.exit(PROBLEM)


def findings_at_or_above(findings, fail_on: str) -> list:
    """The findings of severity ``fail_on`` or above (none for "never")."""
    from diag.analysis.findings import SEVERITY_ORDER

    if fail_on == "never":
        return []
    return [f for f in findings if SEVERITY_ORDER.get(f.severity, 0) <= SEVERITY_ORDER[fail_on]]
