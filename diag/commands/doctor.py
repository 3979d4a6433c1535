"""``diag doctor``: would a hang of this job be diagnosable? The settings checked are diag/readiness.py's."""

from __future__ import annotations

import json
import os
import statistics
import textwrap
from pathlib import Path

import click

from diag.commands.exit_codes import PROBLEM, InputError

MARKS = {"ok": "ok    ", "note": "note  ", "change": "CHANGE"}
INDENT = " " * 9
WIDTH = 112


@click.command("doctor")
@click.argument("trace_dir", required=False, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def command(trace_dir, fmt):
    """Check that a hang of a job could be diagnosed: Flight Recorder and its dump, NCCL's watchdog and log,
    the collective timeout against the step time, and whether dumps and traces land where every rank's can be
    read together.

    Without TRACE_DIR: this shell's environment (run it where the job is launched, e.g. in the batch script).
    With TRACE_DIR: the settings the job's ranks ran with (their manifests), its timeouts and step time.
    Exit status 1 when a setting should change (diag docs triage, "Before a hang").

    \b
    Example:
      diag doctor                  # this environment
      diag doctor traces/run1      # what the job ran with
    """
    from diag import readiness

    if trace_dir is None:
        environ, job, source = dict(os.environ), _job_from_environment(), "this environment"
    else:
        environ, job = _settings_of_trace(trace_dir)
        source = f"the job in {trace_dir}"
    checks = readiness.check(environ, job)
    if fmt == "json":
        click.echo(json.dumps({"source": source, "checks": [c.to_dict() for c in checks]}, indent=1))
    else:
        click.echo(_text(checks, source))
    if readiness.worst(checks) == "change":
        raise SystemExit(PROBLEM)


def _job_from_environment():
    from diag.readiness import JobFacts

    def number(name):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    return JobFacts(world_size=number("WORLD_SIZE"), local_world_size=number("LOCAL_WORLD_SIZE"))


def _settings_of_trace(trace_dir: Path):
    """Rank 0's settings (or the lowest rank's), the backend and timeouts of the run's groups, the median step."""
    from diag.readiness import JobFacts
    from diag.trace.loader import TraceError, load
    from diag.views.format import printable

    if not trace_dir.exists():
        raise InputError(f"{printable(str(trace_dir))} does not exist; give the trace directory diag.init wrote")
    try:  # manifests alone will do: a job that hung before its first steps were written is the case in point
        trace = load(trace_dir)
    except TraceError as exc:
        raise InputError(str(exc)) from exc
    if not trace.manifests:
        raise InputError(f"{printable(str(trace_dir))} has no manifest.json: no settings to check")
    manifest = trace.manifests[min(trace.manifests)]
    timeouts = {
        name: group.timeout_s
        for m in trace.manifests.values()
        for name, group in m.process_groups.items()
        if group.timeout_s is not None
    }
    job = JobFacts(
        backend=manifest.backend,
        world_size=manifest.world_size,
        local_world_size=manifest.local_world_size,
        trace_dir=str(trace_dir),
        timeouts_s=timeouts or None,
        median_step_s=_median_step_s(trace.steps),
    )
    return manifest.hang_settings, job


def _median_step_s(steps) -> float | None:
    """The median over steps of the slowest rank's step time: what a collective waits for at worst."""
    if steps.empty:
        return None
    slowest_us = steps.groupby("step")["duration_us"].max().dropna()
    return float(statistics.median(slowest_us)) / 1e6 if len(slowest_us) else None


def _text(checks, source: str) -> str:
    from diag import readiness
    from diag.views.format import printable

    lines = [f"Hang readiness of {printable(source)}:"]
    for check in checks:
        lines.append(f"  {MARKS[check.status]} {check.name}: {printable(check.now)}")
        if check.status != "ok":
            lines.append(f"{INDENT}set {printable(check.advice)}")
        lines.append(textwrap.fill(printable(check.why), WIDTH, initial_indent=INDENT, subsequent_indent=INDENT))
    worst = readiness.worst(checks)
    changes = sum(c.status == "change" for c in checks)
    lines.append("")
    lines.append(f"{changes} setting(s) to change before the next run" if worst == "change" else "nothing to change")
    return "\n".join(lines)
