"""Inputs `diag analyze` must survive: each gets a clear message and, where anything is usable, a partial
report that says what it left out."""

from __future__ import annotations

import json
import shutil

from tests.analysis.helpers import cli_json, findings_of, make_trace, report_of, run_cli


def test_empty_directory_fails_with_a_clear_message(tmp_path):
    result = run_cli(tmp_path)
    assert result.exit_code != 0
    assert "no diag traces" in result.output and "rank00000" in result.output


def test_missing_directory_fails_with_a_clear_message(tmp_path):
    result = run_cli(tmp_path / "nope")
    assert result.exit_code != 0
    assert "does not exist" in result.output


def test_directory_of_unrelated_files_fails_with_a_clear_message(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "rankings").mkdir()
    result = run_cli(tmp_path)
    assert result.exit_code != 0
    assert "no diag traces" in result.output


def test_unreadable_schema_everywhere_fails_and_lists_why(tmp_path):
    make_trace(tmp_path, ranks=2, steps=10)
    for csv in tmp_path.glob("rank*/*.csv"):
        text = csv.read_text().replace("schema=1", "schema=99", 1)
        csv.write_text(text)
    result = run_cli(tmp_path, "--no-cache")
    assert result.exit_code != 0
    assert "nothing in" in result.output and "schema version 99" in result.output


def test_two_runs_mixed_keeps_the_larger_run_and_says_so(tmp_path):
    plants = make_trace(tmp_path)
    for rank in (14, 15):
        manifest_path = tmp_path / f"rank{rank:05d}" / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["run_id"] = "another-run"
        manifest_path.write_text(json.dumps(manifest))
    report = cli_json(tmp_path)
    assert report["run"]["run_id"] == "synthetic"
    assert 14 not in report["run"]["ranks_found"] and 15 not in report["run"]["ranks_found"]
    assert any("other runs" in s["reason"] for s in report["run"]["skipped"])
    assert [s["rank"] for s in report["stragglers"] if s["cause"] == "compute" and s["persistent"]] == [
        plants.compute_straggler
    ]


def test_missing_ranks_are_reported_and_the_rest_analysed(tmp_path):
    plants = make_trace(tmp_path)
    shutil.rmtree(tmp_path / "rank00004")
    shutil.rmtree(tmp_path / "rank00005")
    report = cli_json(tmp_path)
    assert report["run"]["ranks_missing"] == [4, 5]
    assert any("2 of 16 ranks have no traces" in n for n in report["run"]["notes"])
    assert plants.compute_straggler in findings_of(report, "straggler")[0]["ranks"]


def test_rank_killed_before_its_first_write_is_named_and_the_rest_analysed(tmp_path):
    plants = make_trace(tmp_path)
    for table in (tmp_path / "rank00008").glob("*.csv"):  # only the manifest written at init remains
        table.unlink()
    (tmp_path / "rank00009" / "steps.csv").write_bytes(b"")  # created, never flushed
    report = cli_json(tmp_path)
    assert report["run"]["ranks_without_steps"] == [8, 9] and report["run"]["ranks_missing"] == []
    assert any(n.startswith("ranks 8, 9 recorded no step") for n in report["run"]["notes"]), report["run"]["notes"]
    assert plants.compute_straggler in findings_of(report, "straggler")[0]["ranks"]


def test_truncated_and_corrupt_files_are_skipped_with_reasons(tmp_path):
    plants = make_trace(tmp_path)
    steps_csv = tmp_path / "rank00002" / "steps.csv"
    steps_csv.write_bytes(steps_csv.read_bytes()[:-37])  # cut mid-row
    coll_csv = tmp_path / "rank00003" / "collectives.csv"
    with open(coll_csv, "a") as handle:
        handle.write("garbage,row\n12,0,not-a-number,allreduce,1,bfloat16,,1,1.0,0,ddp\n")
    (tmp_path / "rank00008" / "manifest.json").write_text("{not json")
    (tmp_path / "rank00009" / "memory.csv").write_bytes(b"\x00\xff binary junk\n")
    report = cli_json(tmp_path)
    reasons = {
        (s["path"].split("/")[-2] + "/" + s["path"].split("/")[-1]): s["reason"] for s in report["run"]["skipped"]
    }
    assert "corrupt rows" in reasons["rank00003/collectives.csv"]
    assert "unreadable JSON" in reasons["rank00008/manifest.json"]
    assert "no marker line" in reasons["rank00009/memory.csv"]
    assert 2 in report["run"]["window"]["ranks_short"]  # its cut last row is a step it did not finish
    assert report["run"]["window"]["steps_analysed"] > 0
    assert plants.compute_straggler in findings_of(report, "straggler")[0]["ranks"]


def test_run_still_being_written_analyses_the_steps_every_rank_finished(tmp_path):
    make_trace(tmp_path)
    for rank, cut_rows in ((1, 3), (7, 1)):
        steps_csv = tmp_path / f"rank{rank:05d}" / "steps.csv"
        lines = steps_csv.read_bytes().splitlines(keepends=True)
        kept = lines[: len(lines) - cut_rows]
        steps_csv.write_bytes(b"".join(kept) + lines[len(lines) - cut_rows][:20])  # a row half-written
    report = cli_json(tmp_path)
    window = report["run"]["window"]
    assert window["last_step"] == 56  # steps 0..59 recorded; rank 1's rows for 57..59 are cut or missing
    assert window["incomplete_steps_excluded"] == [57, 58, 59]
    assert window["ranks_short"] == [1, 7]
    assert any("not finished by every rank" in n for n in report["run"]["notes"])


def test_steps_some_ranks_never_finished_are_left_out(tmp_path):
    make_trace(tmp_path, ranks=4, steps=30, plants=None)
    steps_csv = tmp_path / "rank00002" / "steps.csv"
    lines = steps_csv.read_text().splitlines(keepends=True)
    steps_csv.write_text("".join(lines[:2] + [row for row in lines[2:] if int(row.split(",")[0]) not in (10, 11)]))
    report = report_of(tmp_path)
    window = report["run"]["window"]
    assert window["incomplete_steps_excluded"] == [10, 11]
    assert window["steps_analysed"] == 30 - 2 - len(window["warmup_steps_excluded"])
    assert all(s["step"] not in (10, 11) for s in report["timeline"]["per_step"])


def test_single_rank_run_gets_a_report_and_no_straggler(tmp_path):
    make_trace(tmp_path, ranks=1, steps=30)
    report = cli_json(tmp_path)
    assert report["run"]["ranks_found"] == [0]
    assert report["stragglers"] == []
    assert "one rank only" in report["straggler_method"]["note"]
    assert report["mfu"]["median"] is not None


def test_step_window_option_is_respected_and_validated(tmp_path):
    make_trace(tmp_path, ranks=4, steps=40)
    report = cli_json(tmp_path, "--steps", "10:20")
    window = report["run"]["window"]
    assert (window["first_step"], window["last_step"], window["user_range"]) == (10, 19, "10:20")
    assert window["warmup_steps_excluded"] == []
    bad = run_cli(tmp_path, "--steps", "ten")
    assert bad.exit_code != 0 and "--steps" in bad.output
