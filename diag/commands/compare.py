"""``diag compare``: what changed between two runs (or more), where the time went, and how well a job scales.
Never imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diag.commands._load import load_summary
from diag.commands._options import Finite, parse_steps, quiet_option, workers_option
from diag.commands.exit_codes import PROBLEM, InputError, require_extra


def _labels(paths: list[Path]) -> list[str]:
    """Each run's name in the output: its directory's name, or its path where two names are alike."""
    names = [p.resolve().name or str(p) for p in paths]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names, strict=True)]


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json", "html"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Write to FILE instead of stdout."
)
@click.option("--steps", metavar="A:B", help="Compare steps A <= step < B of every run (default: each run's window).")
@click.option(
    "--threshold-pct",
    type=Finite(min=0),
    default=2.0,
    show_default=True,
    help="A change of the steady step time under this is 'no change', whatever its interval.",
)
@click.option(
    "--run-noise-pct",
    type=Finite(min=0),
    help="How far one run's step time sits from the job's own level from run to run (std, %), in the noise "
    "floor; default: the value measured for the runs' kind of machine (CPU runs only; diag docs compare).",
)
@click.option(
    "--interleaved",
    is_flag=True,
    help="The runs are repeats: BASE NEW BASE NEW ... (each pair run one after the other, or together); the "
    "verdict is read from the pairs, whose spread measures the run-to-run noise.",
)
@click.option(
    "--peak-tflops",
    type=Finite(min=0, min_open=True),
    help="Dense peak TFLOP/s per GPU for MFU (overrides the manifests and the datasheet table).",
)
@click.option(
    "--flops-per-step",
    type=Finite(min=0, min_open=True),
    help="Model FLOPs of one step on one rank, for every run (overrides the manifests).",
)
@click.option("--no-cache", is_flag=True, help="Do not read or write the caches in each RUN/.diag-cache.")
@click.option(
    "--fail-on",
    type=click.Choice(["regression", "never"]),
    default="regression",
    show_default=True,
    help="Exit with status 1 when a run's step time regressed against BASE ('never': 0 whatever the verdict).",
)
@workers_option
@quiet_option
def command(
    runs,
    fmt,
    output,
    steps,
    threshold_pct,
    run_noise_pct,
    interleaved,
    peak_tflops,
    flops_per_step,
    no_cache,
    fail_on,
    workers,
    quiet,
):
    """Compare runs: BASE against NEW (and MORE, each against BASE). Says whether step time regressed,
    improved or did not change (a bootstrap interval over the steps, and a noise floor of what runs of one
    job differ by, so the same job run twice reads "no change"; repeats with --interleaved measure it), which components the change came from (data wait, forward, backward, optimizer, exposed
    communication per collective and group, stragglers, pipeline bubble), throughput, MFU, memory,
    bandwidth per collective size and the findings that appeared or disappeared. Runs of different world
    sizes also get scaling efficiency (throughput per GPU against the smallest run) and what grew with scale.
    Configuration differences (model FLOPs, layout, dtype, batch) are listed first. A RUN is a diag trace
    directory or a directory of torch.profiler traces (see diag docs compare).

    Exit status: 0 no regression, 1 a regression of step time (see --fail-on), 2 bad options or a run that
    cannot be read or has no steps.

    \b
    Examples:
      diag compare traces/before traces/after
      diag compare traces/1gpu traces/2gpu traces/4gpu      (scaling efficiency)
      diag compare traces/before traces/after --format json -o compare.json
      diag compare traces/before traces/after --format html -o compare.html
      diag compare a1 b1 a2 b2 a3 b3 --interleaved             (repeats: a verdict that measures the noise)
    """
    from diag.analysis.compare import compare_runs
    from diag.progress import set_quiet
    from diag.views.compare import render_compare

    set_quiet(quiet)
    if fmt == "html":
        require_extra("html", "--format html")
    if len(runs) < 2:
        raise click.UsageError("compare needs at least two runs: BASE NEW [MORE ...]")
    step_range = parse_steps(steps)
    summaries = [
        load_summary(path, label, steps, step_range, peak_tflops, flops_per_step, no_cache, workers=workers)
        for path, label in zip(runs, _labels(list(runs)), strict=True)
    ]
    try:
        report = compare_runs(
            summaries, threshold_pct=threshold_pct, run_noise_pct=run_noise_pct, interleaved=interleaved
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    text = render_compare(report, fmt)
    if output is None:
        click.echo(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {output}: {exc}") from exc
        if not quiet:
            click.echo(f"comparison written to {output}", err=True)
    regressed = [c.new for c in report.comparisons if c.verdict == "regression"]
    if regressed and fail_on == "regression":
        if not quiet:
            click.echo(f"step time regressed in {', '.join(regressed)}: exit status {PROBLEM}", err=True)
        sys.exit(PROBLEM)
