"""A trace directory's cached reports: the cache next to the traces (``diag.trace.cache.TraceCache``), the name a
report is cached under for its options, and a cached report read back, or None when it cannot be trusted. What
``diag analyze``, ``diag compare`` and the dashboard share, so that each reads the report the others cached (same
options, same key). Never imports torch."""

from __future__ import annotations

import json
from pathlib import Path


def open_cache(path: Path, no_cache: bool):
    """The cache of ``path``, or None: ``--no-cache``, not a directory, or torch.profiler traces (read
    directly: they are not diag's tables)."""
    from diag.trace.cache import TraceCache
    from diag.trace.kineto import is_kineto_dir

    if no_cache or not path.is_dir() or is_kineto_dir(path):
        return None
    return TraceCache(path)


def result_name(kind: str, steps: str | None, peak_tflops, flops_per_step) -> str:
    """The cache entry's name of a result computed with these options (``report-...``, ``compare-...``)."""
    from diag.analysis.report import options_fingerprint

    return f"{kind}-{options_fingerprint(steps=steps, peak_tflops=peak_tflops, flops_per_step=flops_per_step)}"


def report_from_state(state: dict, path: Path | None = None):
    """The cached report, or None when it is of another version or shape (a damaged or planted entry): recompute.
    ``path``: the trace directory as asked for now, which the report names instead of the path it was first
    made with (``work/traces/demo``, not the ``traces/demo`` of a run from another directory)."""
    from diag.analysis.report import REPORT_VERSION, Report

    if state.get("report_version", REPORT_VERSION) != REPORT_VERSION or not isinstance(state.get("run"), dict):
        return None
    try:
        report = Report.from_state(state)
        # a report whose JSON cannot be written (what diag analyze --format json writes) is no report
        json.dumps(report.to_dict(), allow_nan=False)
    except Exception:  # noqa: BLE001 - whatever a bad cache entry raises, the answer is to recompute
        return None
    if path is not None:
        _rename_run_path(report.run, str(path))
    return report


def _rename_run_path(run, path: str) -> None:
    """The report's trace path, and the skipped files' paths under it, as ``path``."""
    old = run.path
    run.path = path
    if old == path:
        return
    for skipped in run.skipped:
        where = skipped.get("path")
        if isinstance(where, str) and (where == old or where.startswith(old.rstrip("/") + "/")):
            skipped["path"] = path + where[len(old) :]
