"""A trace directory and its analysis report, through the cache next to it: the one loader ``diag analyze``,
``diag compare`` and the dashboard's Compare page share, so that each reads the report the others cached (same
options, same key) and a damaged cache entry or an unusable trace is handled the same way everywhere. What
cannot be analysed is a ``RunError`` saying why (the commands exit with status 2 on it; the dashboard shows it).
Never imports torch."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from diag.analysis.report_cache import open_cache, report_from_state, result_name
from diag.processes import PARTITIONED_MIN_RANKS


class RunError(Exception):
    """A run that cannot be analysed or compared (missing, unusable, nothing in it, a cluster that failed): the
    message says why and what to do."""


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # before what the command prints after it, as a terminal shows it


@dataclass
class Analysed:
    """A run's report, and its trace when it was loaded (None when the report came from the cache and the
    caller did not ask for the trace)."""

    report: object  # diag.analysis.report.Report
    trace: object | None  # diag.trace.loader.Trace
    cache: object | None  # diag.trace.cache.TraceCache; None with --no-cache or for torch.profiler directories
    report_from_cache: bool


SCHEDULER_CONNECT_TIMEOUT_S = 10


def use_partitioned(path: Path, choice: bool | None, scheduler: str | None) -> bool:
    """Whether to reduce the collectives rank by rank (bounded memory, docs/scale.md) rather than load them
    whole: asked (``--partitioned``), a cluster given, or more than PARTITIONED_MIN_RANKS ranks (where the
    whole table costs gigabytes). Never for torch.profiler directories."""
    from diag.trace.kineto import is_kineto_dir
    from diag.trace.loader import find_rank_dirs

    if not path.is_dir() or is_kineto_dir(path):
        return False
    if choice is not None or scheduler is not None:
        return bool(choice is None or choice)
    return len(find_rank_dirs(path)) > PARTITIONED_MIN_RANKS


def _dask_client(scheduler: str):
    try:
        from distributed import Client
    except ImportError as exc:
        raise RunError(
            "--scheduler needs Dask distributed: pip install 'dask[distributed]' (or '.[scale]' in diag's checkout)"
        ) from exc
    try:
        return Client(scheduler, timeout=SCHEDULER_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise RunError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc


def analyse_partitioned(
    path: Path,
    step_range,
    peak_tflops,
    flops_per_step,
    scheduler: str | None,
    whole_tables: bool = False,
    workers: int | None = None,
):
    """(trace without its collectives, report): the collectives reduced rank by rank, here (in ``workers``
    processes; None: ``diag.processes.worker_count`` decides) or on the Dask cluster at ``scheduler``. The trace's
    per-step tables hold only the columns the analyses read unless ``whole_tables`` (a caller that draws or
    compares the others)."""
    from diag.analysis.partitioned import analyze_partitioned
    from diag.trace.loader import TraceError

    client = _dask_client(scheduler) if scheduler is not None else None
    try:
        trace, report, collective_rows = analyze_partitioned(
            path,
            step_range,
            peak_tflops,
            flops_per_step,
            client=client,
            progress=True,
            with_trace=True,
            analysed_columns_only=not whole_tables,
            workers=workers,
        )
    except TraceError as exc:
        raise RunError(str(exc)) from exc
    except Exception as exc:
        if client is None:
            raise
        # a worker without diag (or another diag), or one that died: the cluster's error, said plainly
        raise RunError(
            f"the Dask cluster at {scheduler} failed to reduce the collectives: {exc!r} (do its workers have "
            "this version of diag installed, and see TRACE_DIR at the same path?)"
        ) from exc
    finally:
        if client is not None:
            client.close()
    if _nothing_usable(trace) and not collective_rows:
        _raise_nothing_usable(path, trace)
    return trace, report


def load_per_step_tables(path: Path):
    """The trace without its collectives (the large table, which the partitioned path never holds whole)."""
    from diag.analysis.partitioned import load_without_collectives
    from diag.trace.loader import TraceError

    try:
        return load_without_collectives(path, progress=True)
    except TraceError as exc:
        raise RunError(str(exc)) from exc


def _raise_nothing_usable(path: Path, trace):
    from diag.analysis.report import capture_stopped_notes

    # a capture that stopped before its first write (the disk already full) is why nothing is there: said first
    said = [*capture_stopped_notes(trace), *trace.skipped[:20]]
    reasons = "\n".join(f"  {s}" for s in said) or (
        "  (no step, collective, memory or telemetry row in any rank: rank directories empty or holding only "
        "manifest.json, or torch.profiler traces without events)"
    )
    raise RunError(f"nothing in {path} could be analysed:\n{reasons}")


def _nothing_usable(trace) -> bool:
    return all(getattr(trace, name).empty for name in ("steps", "phases", "collectives", "memory", "telemetry"))


def load_trace(path: Path, cache, quiet: bool = False):
    """The trace of ``path`` (a diag trace directory, through ``cache`` when given, or torch.profiler traces);
    a RunError when it cannot be read or holds nothing to analyse, with the reasons."""
    from diag.trace.kineto import is_kineto_dir, load_kineto
    from diag.trace.loader import TraceError, load

    try:
        if is_kineto_dir(path):
            trace, how = load_kineto(path), "loaded"
        else:
            trace, how = cache.load(progress=True) if cache is not None else (load(path, progress=True), "loaded")
    except TraceError as exc:
        raise RunError(str(exc)) from exc
    if _nothing_usable(trace):
        _raise_nothing_usable(path, trace)
    if how == "cache" and not quiet:
        _note(f"(trace read from the cache in {path}/.diag-cache)")
    return trace


def analysed(
    path: Path,
    *,
    steps: str | None = None,
    step_range=None,
    peak_tflops=None,
    flops_per_step=None,
    no_cache: bool = False,
    need_trace: bool = False,
    quiet: bool = False,
    partitioned: bool | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
) -> Analysed:
    """``path``'s report for these options: the cached one when there is a valid one, else analysed and cached.
    ``steps`` is the ``--steps`` text (the cache key), ``step_range`` its parsed form. ``need_trace`` loads the
    trace even when the report is cached; ``quiet`` says nothing on stderr about the caches. ``partitioned``,
    ``scheduler``: see ``use_partitioned`` (the same report, in bounded memory); the trace it gives then has
    every table but the collectives, which were reduced rank by rank, in ``workers`` processes (see
    ``diag.processes.worker_count``)."""
    from diag.analysis.report import analyze

    cache = open_cache(path, no_cache)
    name = result_name("report", steps, peak_tflops, flops_per_step)
    report = None
    if cache is not None:
        state = cache.get_result(name)
        report = report_from_state(state, path) if state is not None else None
        if report is not None and not quiet:
            _note(f"(report read from the cache in {path}/.diag-cache; use --no-cache to recompute)")
    from_cache = report is not None
    if use_partitioned(path, partitioned, scheduler):
        if report is not None:  # cached: the per-step tables only, when asked for
            return Analysed(report, load_per_step_tables(path) if need_trace else None, cache, True)
        trace, report = analyse_partitioned(
            path, step_range, peak_tflops, flops_per_step, scheduler, need_trace, workers
        )
        if cache is not None:
            cache.put_result(name, report.to_state(), create=True)  # no table cache: a results-only entry
        return Analysed(report, trace, cache, False)
    trace = load_trace(path, cache, quiet) if report is None or need_trace else None
    if report is None:
        report = analyze(trace, steps=step_range, peak_tflops=peak_tflops, flops_per_step=flops_per_step)
        if cache is not None:
            cache.put_result(name, report.to_state())
    return Analysed(report, trace, cache, from_cache)


def load_summary(
    path: Path,
    label: str,
    steps: str | None = None,
    step_range=None,
    peak_tflops=None,
    flops_per_step=None,
    no_cache: bool = False,
    workers: int | None = None,
):
    """One run's summary (``diag.analysis.compare.RunSummary``): from the cache next to the traces when it is
    there, else loaded and analysed through ``analysed`` (the report ``diag analyze`` caches, and caches for it;
    ``workers``: its worker processes, see ``diag.processes.worker_count``)."""
    from diag.analysis.compare import RunSummary, summarize_run

    cache = open_cache(path, no_cache)
    name = result_name("compare", steps, peak_tflops, flops_per_step)
    if cache is not None:
        state = cache.get_result(name)
        if state is not None:
            try:
                summary = RunSummary.from_state(state)
                summary.label, summary.path = label, str(path)
                return summary
            except Exception:  # noqa: BLE001 - a damaged or foreign cache entry: recompute
                pass
    run = analysed(
        path,
        steps=steps,
        step_range=step_range,
        peak_tflops=peak_tflops,
        flops_per_step=flops_per_step,
        no_cache=no_cache,
        need_trace=True,
        quiet=True,
        workers=workers,
    )
    if run.trace.steps.empty:
        reasons = "\n".join(f"  {s}" for s in run.trace.skipped[:20]) or "  (no rank recorded a step)"
        raise RunError(f"{path}: no steps to compare:\n{reasons}")
    if steps is not None and not run.report.run.window.steps_analysed:
        raise RunError(
            f"{path}: no complete step in --steps {steps} (A <= step < B): the run recorded "
            f"{run.report.run.window.steps_recorded} steps; give a range inside them, or leave --steps out"
        )
    summary = summarize_run(run.trace, run.report, label)
    if cache is not None:
        cache.put_result(name, summary.to_state())
    return summary
