"""Values that cannot be right are detected at load time, dropped or ignored, and named (issue 12 items 6, 8, 11)."""

import json
import math
import shutil
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from diag.trace.loader import Dropped, TraceReader, clean_rank_tables, load
from diag.views.perfetto import write_chrome_trace

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "straggler"


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


def test_ranks_cleaned_one_by_one_drop_what_the_load_drops(tmp_path):
    """clean_rank_tables, rank by rank (how the engine and the export read), drops the rows a load drops: rows
    with an impossible duration, then an earlier run's by the load's cut, and says so in the same notes."""
    run = _copy(tmp_path)
    _append_second_run(run, 10**9)
    path = run / "rank00001" / "steps.csv"
    lines = path.read_text().splitlines()
    for row in (4, len(lines) - 2):  # one row of each run with a negative duration
        fields = lines[row].split(",")
        fields[2] = "-5000"
        lines[row] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    trace = load(run)
    reader = TraceReader(run)
    dropped, kept_rows, events_read = Dropped(), {}, 0
    for rank, rank_dir in reader.rank_dirs().items():
        read = reader.read_rank(rank, rank_dir)
        cleaned, rank_dropped = clean_rank_tables(read.tables)
        cleaned, earlier = clean_rank_tables(cleaned, trace.earlier_run_cuts_us.get(rank))
        dropped += rank_dropped + earlier
        events_read += len(read.events)
        for name, arrow in cleaned.items():
            kept_rows[name] = kept_rows.get(name, 0) + arrow.num_rows
    assert dropped.insane_rows == {"steps": 2} and dropped.earlier_run_rows > 0
    assert [str(n) for n in dropped.insane_notes(run)] == [str(s) for s in trace.skipped if "negative" in s.reason]
    assert kept_rows == {name: len(getattr(trace, name)) for name in kept_rows}
    (earlier_note,) = [s for s in trace.skipped if "start again" in s.reason]
    assert earlier_note.lines == dropped.earlier_run_rows + events_read - len(trace.events)  # the load cuts events too
    tables = TraceReader(run).read_rank(0, run / "rank00000").tables  # a new reader reads from the beginning
    everything, all_dropped = clean_rank_tables(tables, cut_us=float("inf"))
    assert everything == {} and all_dropped.earlier_run_rows > 0  # a table left without rows is left out


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
