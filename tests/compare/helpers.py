"""Run summaries from constructed numbers (for the statistics and attribution tests), and real runs of
compare_job.py (gloo, CPU) for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from diag.analysis.comms import CommsReport
from diag.analysis.compare import RunSummary
from diag.analysis.findings import Finding
from diag.analysis.memory import MemoryReport
from diag.analysis.mfu import MfuReport
from diag.analysis.report import Report, RunInfo, Timeline
from diag.analysis.stragglers import StragglerReport
from diag.analysis.telemetry import TelemetryReport
from diag.analysis.window import StepWindow
from diag.cli import main
from diag.launch import run_ranks, start_ranks

JOB = Path(__file__).with_name("compare_job.py")


def empty_report(path: str = "run", world: int = 2, findings: list[Finding] | None = None) -> Report:
    window = StepWindow(0, 9, 10, 10)
    run = RunInfo(path, None, world, list(range(world)), [], [], 1, "cpu", 10, window)
    return Report(
        run,
        findings or [],
        StragglerReport(),
        MfuReport(),
        CommsReport(),
        MemoryReport(),
        TelemetryReport(),
        Timeline(),
    )


def summary(
    label: str,
    components: dict[str, list[float] | np.ndarray],
    world: int = 2,
    samples_per_step: float | None = None,
    config: dict | None = None,
    findings: list[Finding] | None = None,
) -> RunSummary:
    """A run whose per-step components (ms) are given; its step time is their sum."""
    arrays = {k: np.asarray(v, dtype="float64") for k, v in components.items()}
    step_ms = sum(arrays.values())
    return RunSummary(
        label=label,
        path=label,
        report=empty_report(label, world, findings),
        config={"world_size": world, **(config or {})},
        steps=list(range(len(step_ms))),
        step_ms=[float(v) for v in step_ms],
        components_ms={k: [float(x) for x in v] for k, v in arrays.items()},
        samples_per_step=samples_per_step,
    )


def run_job(trace_dir: Path, world: int = 2, *args: str) -> list[float]:
    """Run compare_job.py to its end; the step times rank 0 measured itself (s)."""
    results = run_ranks([str(JOB), str(trace_dir), *args], world, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(results[0].stdout.strip().splitlines()[-1])["step_s"]


def run_together(*jobs: tuple[Path, int, tuple[str, ...]], timeout_s: float = 300) -> None:
    """Run several compare_job.py jobs (trace dir, ranks, arguments) at the same time, so that they share the
    machine's conditions: on a shared machine the load moves a job's step time by 10-15% from one run to the
    next, and no comparison of two runs can tell that from a change in the job. Rank r of every job is pinned
    to the same core, so that the jobs compete alike for each core (unpinned, the scheduler favoured one job's
    ranks over the other's by up to 12% at a load average of 16)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    started = []
    for path, world, args in jobs:
        procs = start_ranks([str(JOB), str(path), *args], world)
        for rank, proc in enumerate(procs):
            if cpus:
                with contextlib.suppress(OSError):  # the process may be gone already: it then fails below
                    os.sched_setaffinity(proc.pid, {cpus[rank % len(cpus)]})
        started.append(procs)
    try:
        for procs in started:
            for proc in procs:
                _, stderr = proc.communicate(timeout=timeout_s)
                assert proc.returncode == 0, stderr[-3000:]
    finally:
        for proc in (p for procs in started for p in procs):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def compare_json(*paths: Path, extra: tuple[str, ...] = ()) -> dict:
    result = CliRunner().invoke(main, ["compare", *map(str, paths), "--format", "json", "--fail-on", "never", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def median_ms(step_s: list[float]) -> float:
    return 1e3 * statistics.median(step_s[3:])


def row(comparison: dict, component: str) -> dict:
    return next(a for a in comparison["attribution"] if a["component"] == component)


def group(comparison: dict, name: str) -> dict:
    return next((g for g in comparison["groups"] if g["group"] == name), {"delta_ms": 0.0, "share_pct": 0.0})
