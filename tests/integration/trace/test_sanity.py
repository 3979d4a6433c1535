"""Values that cannot be right are detected at load time, dropped or ignored, and named (issue 12 items 6, 8, 11)."""

import json
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from diag.trace.loader import load


def _analyze(run: Path, *extra) -> dict:
    result = CliRunner().invoke(
        main, ["analyze", str(run), "--no-cache", "--format", "json", "--fail-on", "never", *extra]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def _demo_job(trace_dir: Path, steps: int) -> None:
    from diag.launch import run_ranks

    argv = ["-m", "diag.demo", str(trace_dir), "--steps", str(steps)]
    results = run_ranks(argv, 2, timeout_s=300)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]


def test_real_job_run_twice_keeps_nothing_of_the_earlier_run(tmp_path):
    """The demo job (2 ranks, gloo) run twice into one directory: every table and the report hold the latest
    run only. The earlier run writes a memory sample and a calibration as it exits, after its last step ends:
    kept, they made the memory growth and the machine's speed (one calibration from each run) mix both runs."""
    import json

    run, steps = tmp_path / "run", 12
    _demo_job(run, steps)
    _demo_job(run, steps)
    trace = load(run)
    assert any("step numbers start again" in s.reason for s in trace.skipped)
    for rank in (0, 1):
        process_start_us = trace.manifests[rank].start_time_us
        for name in ("steps", "collectives", "memory", "calibration"):
            frame = getattr(trace, name)
            mine = frame[frame["rank"] == rank]
            column = "start_us" if "start_us" in mine else "time_us"
            assert (mine[column] >= process_start_us).all(), (name, rank)
        assert (trace.steps["rank"] == rank).sum() == steps
        assert trace.memory.loc[trace.memory["rank"] == rank, "step"].tolist() == list(range(steps))
        # one calibration as the process starts, one as it finishes: one run's
        assert (trace.calibration["rank"] == rank).sum() == 2
    report = _analyze(run)
    assert report["run"]["steps"] == steps and report["run"]["machine"]["samples"] == 4
    mfu = report["mfu"]
    # 64 samples a rank a step, 2 ranks: the latest run's samples only, over its own steps' time
    samples_per_step = mfu["samples_per_s"] * mfu["step_time_median_s"]
    assert 0.5 * 128 < samples_per_step < 1.5 * 128, json.dumps(mfu)
