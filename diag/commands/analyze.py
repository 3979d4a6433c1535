"""``diag analyze``: what slows the job down, and by how much. Never imports torch."""

from __future__ import annotations

from pathlib import Path

import click

from diag.commands import sample_run


def _nothing_usable(trace) -> bool:
    return all(getattr(trace, name).empty for name in ("steps", "phases", "collectives", "memory", "telemetry"))


def _report_from_cache(state: dict):
    """The cached report, or None when it is of another version or shape (a damaged or planted entry): recompute."""
    from diag.analysis.report import REPORT_VERSION, Report
    from diag.views import render

    if state.get("report_version", REPORT_VERSION) != REPORT_VERSION or not isinstance(state.get("run"), dict):
        return None
    try:
        report = Report.from_state(state)
        render(report, "json")  # a report that cannot be rendered is no report
    except Exception:  # noqa: BLE001 - whatever a bad cache entry raises, the answer is to recompute
        return None
    return report


PARTITIONED_MIN_RANKS = 64  # above this many rank directories the collectives are reduced rank by rank
SCHEDULER_CONNECT_TIMEOUT_S = 10


def _partitioned(trace_dir: Path, choice: bool | None, scheduler: str | None, kineto: bool) -> bool:
    """Whether to reduce the collectives rank by rank (bounded memory) rather than load them whole: asked, or
    a cluster given, or more than PARTITIONED_MIN_RANKS ranks (where the whole table costs gigabytes)."""
    if kineto:
        return False
    if choice is not None or scheduler is not None:
        return bool(choice is None or choice)
    from diag.trace.loader import find_rank_dirs

    return trace_dir.is_dir() and len(find_rank_dirs(trace_dir)) > PARTITIONED_MIN_RANKS


def _analyse_partitioned(trace_dir: Path, step_range, peak_tflops, flops_per_step, scheduler: str | None):
    from diag.analysis.partitioned import analyze_partitioned
    from diag.trace.loader import TraceError

    client = None
    if scheduler is not None:
        try:
            from distributed import Client
        except ImportError as exc:
            raise click.ClickException(
                "--scheduler needs Dask distributed: pip install 'diag[scale]' (or dask[distributed])"
            ) from exc
        try:
            client = Client(scheduler, timeout=SCHEDULER_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise click.ClickException(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
    try:
        trace, report, collective_rows = analyze_partitioned(
            trace_dir, step_range, peak_tflops, flops_per_step, client=client, progress=True, with_trace=True
        )
    except TraceError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        if client is None:
            raise
        # a worker without diag (or another diag), or one that died: the cluster's error, said plainly
        raise click.ClickException(
            f"the Dask cluster at {scheduler} failed to reduce the collectives: {exc!r} (do its workers have "
            "this version of diag installed, and see TRACE_DIR at the same path?)"
        ) from exc
    finally:
        if client is not None:
            client.close()
    if _nothing_usable(trace) and not collective_rows:
        reasons = "\n".join(f"  {s}" for s in trace.skipped[:20]) or "  (every rank directory is empty)"
        raise click.ClickException(f"nothing in {trace_dir} could be analysed:\n{reasons}")
    return report


def _analyse(trace_dir: Path, cache, step_range, peak_tflops, flops_per_step, kineto: bool = False):
    from diag.analysis.report import analyze
    from diag.trace.loader import TraceError, load

    try:
        if kineto:
            from diag.trace.kineto import load_kineto

            trace, how = load_kineto(trace_dir), "loaded"
        else:
            trace, how = cache.load(progress=True) if cache is not None else (load(trace_dir, progress=True), "loaded")
    except TraceError as exc:
        raise click.ClickException(str(exc)) from exc
    if _nothing_usable(trace):
        reasons = "\n".join(f"  {s}" for s in trace.skipped[:20]) or "  (every rank directory is empty)"
        raise click.ClickException(f"nothing in {trace_dir} could be analysed:\n{reasons}")
    if how == "cache":
        click.echo(f"(trace read from the cache in {trace_dir}/.diag-cache)", err=True)
    return analyze(trace, steps=step_range, peak_tflops=peak_tflops, flops_per_step=flops_per_step)


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
    from diag.analysis.report import options_fingerprint
    from diag.analysis.window import parse_step_range
    from diag.trace.cache import TraceCache
    from diag.views import render

    if trace_dir is None:
        trace_dir = sample_run("analysing")
        no_cache = True  # small, and part of the installed package: write nothing next to it
    try:
        step_range = parse_step_range(steps)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--steps") from exc
    from diag.trace.kineto import is_kineto_dir

    report = None
    kineto = is_kineto_dir(trace_dir)  # a directory of torch.profiler traces: read directly, not cached
    cache = None if no_cache or kineto or not trace_dir.is_dir() else TraceCache(trace_dir)
    options = {"steps": steps, "peak_tflops": peak_tflops, "flops_per_step": flops_per_step}
    result_name = f"report-{options_fingerprint(**options)}"
    if cache is not None:
        state = cache.get_result(result_name)
        if state is not None:
            report = _report_from_cache(state)
        if report is not None:
            click.echo(
                f"(report read from the cache in {trace_dir}/.diag-cache; use --no-cache to recompute)", err=True
            )
    if report is None and _partitioned(trace_dir, partitioned, scheduler, kineto):
        report = _analyse_partitioned(trace_dir, step_range, peak_tflops, flops_per_step, scheduler)
        if cache is not None:
            cache.put_result(result_name, report.to_state(), create=True)
    if report is None:
        report = _analyse(trace_dir, cache, step_range, peak_tflops, flops_per_step, kineto)
        if cache is not None:
            cache.put_result(result_name, report.to_state())
    click.echo(render(report, fmt))
    if html_path is not None:
        from diag.views.html import render_html

        try:
            html_path.write_text(render_html(report), encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(f"cannot write {html_path}: {exc}") from exc
        click.echo(f"HTML report written to {html_path}", err=True)
