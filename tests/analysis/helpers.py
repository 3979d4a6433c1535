"""Trace directories for the analysis tests: the synthetic generator (real file format, problems
planted at known ranks) at a small size, and small surgery on them (truncate, corrupt, drop ranks)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from diag.analysis.report import analyze
from diag.cli import main
from diag.launch import run_ranks
from diag.testing import synthetic
from diag.trace import schema
from diag.trace.loader import load

REPO = Path(__file__).resolve().parents[2]

RANKS = 16
STEPS = 60
COLLECTIVES = 4


def make_trace(path: Path, ranks: int = RANKS, steps: int = STEPS, plants=None, seed: int = 0):
    """Write a synthetic trace; returns the plants (which rank has which problem)."""
    return synthetic.generate(path, ranks, steps, COLLECTIVES, plants=plants, seed=seed)


def report_of(path: Path, **options):
    return analyze(load(path), **options).to_dict()


def run_cli(*args: str):
    """``diag analyze ARGS``, its report whatever it found: ``--fail-on never`` (exit status 0 with findings;
    the exit statuses themselves are tests/cli's)."""
    return CliRunner().invoke(main, ["analyze", *map(str, args), "--fail-on", "never"])


def cli_json(path: Path, *args: str) -> dict:
    result = run_cli(path, "--format", "json", "--no-cache", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def analyze_in_subprocess(trace_dir: Path, *args: str, env: dict | None = None, timeout_s: float = 300) -> str:
    """``python -m diag analyze TRACE_DIR --format json --no-cache --fail-on never ARGS`` in a process of its own,
    as a user runs it, with this checkout's diag; returns what it printed on stdout (the JSON report)."""
    result = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(trace_dir), "--format", "json", "--no-cache"]
        + ["--fail-on", "never", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def kinds(report: dict) -> list[str]:
    return [f["kind"] for f in report["findings"]]


def findings_of(report: dict, kind: str) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == kind]


PLANTED_JOB = Path(__file__).with_name("straggler_job.py")
PLANTED_JOB_STEPS = 20
PLANTED_JOB_WARMUP = 3  # the job's own step times, like diag's window, leave the warm-up out


def run_planted_job(
    trace_dir: Path, world: int, mode: str, slow_rank: int, extra_ms: float, bucket_cap_mb: float = 25.0
) -> tuple[float, dict]:
    """Run straggler_job.py to its end: (median step time in s as the job measured it, diag's JSON report)."""
    argv = [str(PLANTED_JOB), str(trace_dir), str(PLANTED_JOB_STEPS), str(slow_rank), mode, str(extra_ms)]
    results = run_ranks([*argv, str(bucket_cap_mb)], world, timeout_s=400)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    step_s = json.loads(results[0].stdout.strip().splitlines()[-1])["step_s"]
    return statistics.median(step_s[PLANTED_JOB_WARMUP:]), cli_json(trace_dir)


def cost_truths_s(measured_s: float, planted_s: float) -> tuple[float, float]:
    """What a planted straggler's cost may be checked against: the slowdown measured between a run without and a
    run with the plant, and the plant itself. On this shared 2-core machine the run-to-run difference swings by
    a quarter: the same 40 ms sleep in fsdp1-full measured 27 and 32 ms in two full-suite runs (the sleeping rank
    frees a core the baseline's ranks had shared with other processes) while diag named 40.2 ms both times.
    The estimate must land near one of the two; it still fails when it is near neither."""
    return measured_s, planted_s


def steps_row(*values) -> str:
    """A steps.csv line with ``values`` first and the table's other columns empty: rows a test appends keep
    the table's width as columns are added."""
    return ",".join(map(str, values)) + "," * (len(schema.STEPS.column_names) - len(values)) + "\n"


def engine_read_equals_loaded(tmp_path, monkeypatch, batch_ranks: int, workers: int) -> None:
    """The engine's runner over a small trace's files (``batch_ranks`` a batch, in ``workers`` processes) gives
    the result of the loaded tables: memory, telemetry and health (both its stages) alike, and every row read
    but those of the steps, which the load had read (and said what it skipped of)."""
    from diag.analysis import engine
    from diag.analysis.health import HealthAnalysis
    from diag.analysis.memory import DeviceTotals, MemoryAnalysis
    from diag.analysis.report import telemetry_bounds
    from diag.analysis.section import json_safe
    from diag.analysis.telemetry import TelemetryAnalysis
    from diag.analysis.window import choose_window, select
    from tests.analysis.golden import differences

    synthetic.generate(tmp_path, 6, 20, 2, synthetic.Plants.with_health(6, 20), trace_format=2)
    trace = load(tmp_path)
    window = choose_window(trace.steps, None, set())
    bounds = telemetry_bounds(select(trace.steps, window))
    health = HealthAnalysis.of(trace.events, trace.manifests)
    analyses = (TelemetryAnalysis({}), MemoryAnalysis(window), DeviceTotals(), health)
    monkeypatch.setattr(engine, "BATCH_RANKS", batch_ranks)
    read, notes = engine.run(analyses, engine.rank_sources(trace, bounds), workers=workers, reported=("steps",))
    tables = {"memory": trace.memory, "telemetry": trace.telemetry, "steps": trace.steps}
    loaded = engine.run_loaded(analyses, engine.Shard(tables, bounds))
    assert read[3].departures and read[3].divergence is not None  # the second stage found what was planted
    assert differences(json_safe(loaded), json_safe(read)) == []
    assert notes.skipped == [] and notes.rows_read == len(trace.memory) + len(trace.telemetry)
