"""Values that cannot be right are detected at load time, dropped or ignored, and named (issue 12 items 6, 8, 11)."""

import json
import math
import shutil
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from diag.trace.loader import load
from diag.views.perfetto import write_chrome_trace

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler"


def _copy(tmp_path) -> Path:
    shutil.copytree(SAMPLE, tmp_path / "run")
    return tmp_path / "run"


def _append_second_run(run: Path, shift_us: int) -> None:
    for rank_dir in sorted(run.glob("rank*")):
        lines = (rank_dir / "steps.csv").read_text().splitlines()[2:]
        shifted = []
        for line in lines:
            fields = line.split(",")
            fields[1] = str(int(fields[1]) + shift_us)
            shifted.append(",".join(fields))
        with open(rank_dir / "steps.csv", "a") as f:
            f.write("\n".join(shifted) + "\n")


def _analyze(run: Path, *extra) -> dict:
    result = CliRunner().invoke(
        main, ["analyze", str(run), "--no-cache", "--format", "json", "--fail-on", "never", *extra]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def test_second_run_appended_is_separated_and_named(tmp_path):
    run = _copy(tmp_path)
    once = load(run)
    _append_second_run(run, shift_us=10**9)
    twice = load(run)
    assert len(twice.steps) == len(once.steps)  # the latest run only, not both
    assert not twice.steps.duplicated(["rank", "step"]).any()
    assert any("step numbers start again" in s.reason for s in twice.skipped)
    report = _analyze(run)
    assert any("step numbers start again" in str(s) for s in report["run"]["skipped"])


def test_second_run_with_clock_behind_still_separates_steps(tmp_path):
    run = _copy(tmp_path)
    once = load(run)
    _append_second_run(run, shift_us=-(10**9))
    twice = load(run)
    assert len(twice.steps) == len(once.steps)
    assert any("clock went backwards" in s.reason for s in twice.skipped)


def test_swapped_start_and_duration_and_negative_durations_are_dropped(tmp_path):
    run = _copy(tmp_path)
    path = run / "rank00000" / "steps.csv"
    lines = path.read_text().splitlines()
    fields = lines[5].split(",")
    fields[1], fields[2] = fields[2], fields[1]  # start and duration swapped
    lines[5] = ",".join(fields)
    fields = lines[6].split(",")
    fields[2] = "-5000"
    lines[6] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    trace = load(run)
    assert (trace.steps["duration_us"] >= 0).all() and trace.steps["duration_us"].max() < 7 * 86400e6
    (note,) = [s for s in trace.skipped if "negative duration" in s.reason]
    assert note.lines == 2


def _edit_manifest(run: Path, rank: int, **changes) -> None:
    path = run / f"rank{rank:05d}" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_implausible_world_size_is_ignored_and_named(tmp_path):
    run = _copy(tmp_path)
    _edit_manifest(run, 0, world_size=-5)
    _edit_manifest(run, 1, world_size=1e10)
    trace = load(run)
    assert trace.world_size == 3 and trace.ranks_missing == []
    assert any("implausible world_size" in s.reason for s in trace.skipped)


def test_huge_rank_directory_does_not_exhaust_memory(tmp_path):
    run = _copy(tmp_path)
    shutil.copytree(run / "rank00002", run / "rank99999999999")
    trace = load(run)
    assert trace.ranks_found == [0, 1, 2] and trace.world_size == 3
    assert any("rank number above" in s.reason for s in trace.skipped)


def test_two_spellings_of_one_rank_are_named(tmp_path):
    run = _copy(tmp_path)
    shutil.copytree(run / "rank00001", run / "rank1")
    trace = load(run)
    assert trace.ranks_found == [0, 1, 2]
    (note,) = [s for s in trace.skipped if "second directory for rank 1" in s.reason]
    assert note.path.endswith("rank1")


def test_zero_peak_tflops_and_newer_schema(tmp_path):
    run = _copy(tmp_path)
    for rank in range(3):
        _edit_manifest(run, rank, peak_tflops=0, schema_version=99)
    trace = load(run)
    reasons = " ".join(s.reason for s in trace.skipped)
    assert "peak_tflops 0 is not a positive number" in reasons and "schema_version 99" in reasons
    report = _analyze(run)  # ZeroDivisionError before
    assert report["mfu"] is not None


def test_cli_rejects_zero_peak_and_bad_port():
    runner = CliRunner()
    result = runner.invoke(main, ["analyze", str(SAMPLE), "--peak-tflops", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    result = runner.invoke(main, ["dashboard", str(SAMPLE), "--port", "70000"])
    assert result.exit_code == 2 and "70000" in result.output and not isinstance(result.exception, AssertionError)


def test_export_never_writes_infinity_and_survives_no_manifests(tmp_path):
    run = _copy(tmp_path)
    path = run / "rank00000" / "collectives.csv"
    lines = path.read_text().splitlines()
    fields = lines[2].split(",")
    fields[8] = "inf"
    lines[2] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    for manifest in run.glob("rank*/manifest.json"):
        manifest.unlink()
    trace = load(run)
    out = tmp_path / "trace.json"
    assert write_chrome_trace(trace, out) > 0
    text = out.read_text()
    assert "Infinity" not in text and "NaN" not in text
    parsed = json.loads(text, parse_constant=lambda c: math.nan)
    assert parsed["traceEvents"]


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
