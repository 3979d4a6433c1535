"""``diag analyze``: what slows the job down, and by how much. Never imports torch."""

from __future__ import annotations

from pathlib import Path

import click

from diag.commands import sample_run
from diag.commands._load import PARTITIONED_MIN_RANKS


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
    type=click.FloatRange(min=0, min_open=True),
    help="Dense peak TFLOP/s per GPU for MFU (overrides the manifest and the datasheet table).",
)
@click.option(
    "--flops-per-step",
    type=click.FloatRange(min=0, min_open=True),
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
    f"(default: rank by rank above {PARTITIONED_MIN_RANKS} ranks or with --scheduler). See docs/scale.md.",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Run the per-rank reduction on this Dask cluster (tcp://host:8786); its workers read TRACE_DIR "
    "themselves, so it must be on a filesystem they share. Needs pip install 'diag[scale]'.",
)
def command(trace_dir, fmt, html_path, steps, peak_tflops, flops_per_step, no_cache, partitioned, scheduler):
    """Analyse a trace directory: stragglers, MFU, communication, memory and GPU telemetry,
    with findings ranked by the time each one costs. TRACE_DIR may also be a directory of
    torch.profiler (Kineto) traces, one *.json or *.json.gz per rank: GPU time is then split
    into compute, communication, memory copies and idle (see docs/kineto.md).

    \b
    Examples:
      diag analyze traces/run1
      diag analyze profiler_traces/    (torch.profiler *.pt.trace.json files)
      diag analyze traces/run1 --steps 100:500 --format json > report.json
      diag analyze traces/run1 --html report.html --peak-tflops 989
      diag analyze                     (the bundled sample run)
    """
    from diag.analysis.window import parse_step_range
    from diag.commands._load import analysed
    from diag.views import render

    if trace_dir is None:
        trace_dir = sample_run("analysing")
        no_cache = True  # small, and part of the installed package: write nothing next to it
    try:
        step_range = parse_step_range(steps)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--steps") from exc
    report = analysed(
        trace_dir,
        steps=steps,
        step_range=step_range,
        peak_tflops=peak_tflops,
        flops_per_step=flops_per_step,
        no_cache=no_cache,
        partitioned=partitioned,
        scheduler=scheduler,
    ).report
    click.echo(render(report, fmt))
    if html_path is not None:
        from diag.views.html import render_html

        try:
            html_path.write_text(render_html(report), encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(f"cannot write {html_path}: {exc}") from exc
        click.echo(f"HTML report written to {html_path}", err=True)
