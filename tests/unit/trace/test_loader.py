"""The loader survives bad input: it reads what it can and says what it skipped."""

import json

import pytest

from diag.trace.loader import TraceError, TraceReader, load
from diag.trace.schema import COLLECTIVES, STEPS
from diag.trace.writer import RankWriter
from tests.analysis.helpers import steps_row
from tests.trace.helpers import step_row


def write_rank(
    root, rank: int, steps: int, run_id: str = "run-a", world_size: int = 2, schema_version: int = 1
) -> None:
    """One rank's files; CSV (schema version 1) unless asked: these tests edit the CSV files by hand."""
    writer = RankWriter(root / f"rank{rank:05d}", schema_version=schema_version)
    writer.write_manifest({"rank": rank, "world_size": world_size, "run_id": run_id, "schema_version": 1})
    for step in range(steps):
        writer.append("steps", step_row(step))
        writer.append(
            "collectives",
            COLLECTIVES.row(
                step=step,
                pg="0",
                seq=step + 1,
                op="all_reduce",
                bytes=4096,
                dtype="float32",
                start_us=10,
                duration_us=55.5,
                blocking=0,
                source="ddp",
            ),
        )
    writer.close()


def test_round_trip_with_types_and_units(tmp_path):
    write_rank(tmp_path, 0, 3)
    write_rank(tmp_path, 1, 3)
    trace = load(tmp_path)
    assert trace.ranks_found == [0, 1] and trace.ranks_missing == [] and trace.skipped == []
    assert list(trace.steps.columns) == ["rank", *STEPS.column_names]
    assert list(trace.collectives.columns) == ["rank", *COLLECTIVES.column_names]
    assert str(trace.collectives["op"].dtype) == "category" and trace.collectives["duration_us"].iloc[0] == 55.5
    assert trace.steps["samples"].tolist() == [32] * 6 and trace.steps["device_us"].isna().all()
    assert trace.run_id == "run-a" and trace.world_size == 2


def test_half_written_last_line_is_ignored_and_read_later(tmp_path):
    write_rank(tmp_path, 0, 2, world_size=1)
    path = tmp_path / "rank00000" / "steps.csv"
    with open(path, "a") as f:
        f.write("2,1040000,20000")  # the writer is in the middle of this row
    reader = TraceReader(tmp_path)
    first = reader.poll()
    assert first["steps"]["step"].tolist() == [0, 1] and first["skipped"] == []
    with open(path, "a") as f:
        rest_of_row_2 = steps_row(2, 1040000, 20000, 10, 5000, 9000, 1000, 2000, "", 32)[len("2,1040000,20000") :]
        f.write(rest_of_row_2 + steps_row(3, 1060000, 20000, 10, 5000, 9000, 1000, 2000, "", 32))
    second = reader.poll()  # only the rows appended since
    assert second["steps"]["step"].tolist() == [2, 3]
    assert reader.poll()["steps"].empty


def test_corrupt_rows_are_skipped_and_counted(tmp_path):
    write_rank(tmp_path, 0, 3, world_size=1)
    path = tmp_path / "rank00000" / "steps.csv"
    with open(path, "a") as f:
        f.write(steps_row(3, "garbage", 20000, 10, 5000, 9000, 1000, 2000, "", 32))
        f.write("\x00\x00\x00binary junk\n")
        f.write(steps_row(4, 1080000, 20000, 10, 5000, 9000, 1000, 2000, "", 32))
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2, 4]
    assert [(s.reason, s.lines) for s in trace.skipped] == [("corrupt rows skipped", 2)]


def test_file_of_another_schema_version_is_reported_not_read(tmp_path):
    write_rank(tmp_path, 0, 2, world_size=1)
    path = tmp_path / "rank00000" / "steps.csv"
    path.write_text(path.read_text().replace("schema=1", "schema=99"))
    trace = load(tmp_path)
    assert trace.steps.empty and len(trace.collectives) == 2
    assert any("schema version 99" in s.reason for s in trace.skipped)


def test_missing_ranks_and_manifests_are_reported(tmp_path):
    write_rank(tmp_path, 0, 2, world_size=4)
    write_rank(tmp_path, 2, 2, world_size=4)
    (tmp_path / "rank00002" / "manifest.json").unlink()
    trace = load(tmp_path)
    assert trace.ranks_found == [0, 2] and trace.ranks_missing == [1, 3]
    assert any("ranks [2] have no readable manifest.json" in str(s) for s in trace.skipped)
    assert sorted(trace.steps["rank"].unique()) == [0, 2]  # rows of the rank without manifest are kept


def test_two_runs_mixed_keeps_the_larger_and_says_so(tmp_path):
    write_rank(tmp_path, 0, 2, run_id="run-a", world_size=3)
    write_rank(tmp_path, 1, 2, run_id="run-a", world_size=3)
    write_rank(tmp_path, 2, 2, run_id="run-b", world_size=3)
    trace = load(tmp_path)
    assert trace.run_id == "run-a" and trace.ranks_found == [0, 1]
    assert sorted(trace.steps["rank"].unique()) == [0, 1]
    assert any("other runs (run-b)" in str(s) for s in trace.skipped)


def test_corrupt_manifest_and_events(tmp_path):
    write_rank(tmp_path, 0, 1, world_size=1)
    (tmp_path / "rank00000" / "manifest.json").write_text("{not json")
    (tmp_path / "rank00000" / "events.jsonl").write_text(json.dumps({"kind": "oom", "time_us": 1}) + "\n{broken\n")
    trace = load(tmp_path)
    assert len(trace.steps) == 1 and trace.events["kind"].tolist() == ["oom"]
    reasons = [s.reason for s in trace.skipped]
    assert any(r.startswith("unreadable JSON") for r in reasons) and "corrupt events skipped" in reasons


def test_event_values_are_checked_where_read_and_the_report_goes_on(tmp_path):
    """Strings where numbers belong, lists, dicts, 1e300, Infinity: each value is left out of its row and
    counted; the analyses (OOM explanation, failures, health) run on what is left."""
    from diag.analysis.report import analyze

    write_rank(tmp_path, 0, 3, world_size=1)
    rows = [
        '{"time_us": "x", "kind": "step_error", "step": "3", "error": "boom"}',
        '{"time_us": 1e300, "kind": "nonfinite", "step": [1]}',
        '{"time_us": Infinity, "kind": "step_error", "step": {}}',
        '{"time_us": 5, "kind": "oom", "step": 1e300, "allocated_bytes": NaN, "message": 7}',
        '{"time_us": 99999999999999999999999999, "kind": "heartbeat_gap", "start_us": 12}',
        '{"time_us": 12, "kind": ["x"], "step": 1}',
    ]
    (tmp_path / "rank00000" / "events.jsonl").write_text("\n".join(rows) + "\n")
    trace = load(tmp_path)
    events = trace.events
    assert events["kind"].tolist() == ["step_error", "nonfinite", "step_error", "oom", "heartbeat_gap"]
    assert events["time_us"].isna().tolist() == [True, True, True, False, True]
    assert events["step"].isna().all() and events["message"].tolist()[3] == "7"
    reasons = " ".join(str(s) for s in trace.skipped)
    assert "corrupt events skipped (1 lines)" in reasons and "9 event values of the wrong type" in reasons
    report = analyze(trace).to_dict()
    assert report["run"]["ranks_found"] == [0]


def test_distinct_event_keys_are_collapsed_not_a_column_each(tmp_path):
    """30,000 distinct keys over 1,000 rows made a 30,000-column frame (6.7 GiB asked for): the known fields
    keep their columns, the others go into one ``extra`` field of at most 32 keys a row."""
    write_rank(tmp_path, 0, 3, world_size=1)
    with open(tmp_path / "rank00000" / "events.jsonl", "w") as f:
        for i in range(1000):
            f.write(json.dumps({"time_us": 10 + i, "kind": "custom", **{f"k{i}_{j}": j for j in range(30)}}) + "\n")
        f.write(json.dumps({"time_us": 1, "kind": "custom", **{f"many{j}": j for j in range(40)}}) + "\n")
    events = load(tmp_path).events
    assert len(events) == 1001 and set(events.columns) == {"time_us", "kind", "extra", "rank"}
    assert events["extra"].iloc[0] == {f"k0_{j}": j for j in range(30)} and len(events["extra"].iloc[-1]) == 32


def test_nothing_to_analyse_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("unrelated")
    with pytest.raises(TraceError, match="no diag traces"):
        load(tmp_path)
    with pytest.raises(TraceError, match="not a directory"):
        load(tmp_path / "notes.txt")


@pytest.mark.parametrize(
    "bad_row",
    [
        b"0.5,1,2,3,4,5,6,7,,32,\n",  # a float in an integer column
        b"inf,1,2,3,4,5,6,7,,32,\n",
        b"123456789012345678901,1,2,3,4,5,6,7,,32,\n",  # 21 digits: beyond int64
        b"1,\xff\xfe\x00junk,2,3\n",  # non-UTF-8 and binary
        b'1,"2,3,4\n',  # a stray quote
        b"7,1,nan,3,4,5,6,7,,32,\n",
    ],
)
def test_corrupt_row_is_skipped_and_counted_never_fatal(tmp_path, bad_row):
    write_rank(tmp_path, 0, 3, world_size=1)
    path = tmp_path / "rank00000" / "steps.csv"
    data = path.read_bytes()
    lines = data.split(b"\n")
    path.write_bytes(b"\n".join(lines[:3]) + b"\n" + bad_row + b"\n".join(lines[3:]))
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2]
    (skip,) = [s for s in trace.skipped if "corrupt rows" in s.reason]
    assert skip.lines == 1 and skip.path.endswith("steps.csv")


def test_non_utf8_category_and_inf_float(tmp_path):
    write_rank(tmp_path, 0, 3, world_size=1)
    path = tmp_path / "rank00000" / "collectives.csv"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"all_reduce", b"all_\xffreduce", 1).replace(b",55.5,", b",inf,", 1))
    trace = load(tmp_path)
    assert len(trace.collectives) == 2 and trace.collectives["duration_us"].notna().all()
    assert any(s.lines == 1 for s in trace.skipped if s.path.endswith("collectives.csv"))


def test_inf_in_float_column_becomes_null_on_the_fast_path(tmp_path):
    write_rank(tmp_path, 0, 2, world_size=1)
    path = tmp_path / "rank00000" / "collectives.csv"
    path.write_bytes(path.read_bytes().replace(b",55.5,", b",inf,", 1))
    trace = load(tmp_path)
    assert trace.collectives["duration_us"].isna().sum() == 1 and len(trace.collectives) == 2


def test_poll_survives_a_bad_row_appended_live(tmp_path):
    write_rank(tmp_path, 0, 2, world_size=1)
    reader = TraceReader(tmp_path)
    assert len(reader.poll()["steps"]) == 2
    with open(tmp_path / "rank00000" / "steps.csv", "ab") as f:
        f.write(b"2.5,\xff,inf,1,2,3\n" + steps_row(3, 1000, 20, 1, 2, 3, 4, 5, "", 32).encode())
    polled = reader.poll()
    assert polled["steps"]["step"].tolist() == [3] and any(s.lines == 1 for s in polled["skipped"])
    with open(tmp_path / "rank00000" / "steps.csv", "ab") as f:
        f.write(steps_row(4, 1000, 20, 1, 2, 3, 4, 5, "", 32).encode())
    assert reader.poll()["steps"]["step"].tolist() == [4]  # the poller goes on after the bad row


@pytest.mark.parametrize("last_step", [[[[]]], "x", {"a": 1}, 1e300, True])
def test_heartbeat_values_are_checked_where_read_and_the_report_goes_on(tmp_path, last_step):
    """A heartbeat's exit record beside a last step of the wrong type: the step reads as unknown, the exit
    is still reported (the analysis met the list as it was and raised in int())."""
    import shutil

    import pandas as pd
    from click.testing import CliRunner

    from diag.cli import main
    from tests.conftest import REPO

    run = tmp_path / "hang"
    shutil.copytree(REPO / "sample_traces" / "hang", run)
    path = run / "rank00000" / "heartbeat.json"
    heartbeat = json.loads(path.read_text())
    heartbeat["last_step"] = last_step
    path.write_text(json.dumps(heartbeat))
    beats = load(run).heartbeats.set_index("rank")
    assert pd.isna(beats.loc[0, "last_step"]) and beats.loc[0, "exit"]["how"] == heartbeat["exit"]["how"]
    result = CliRunner().invoke(main, ["analyze", str(run), "--no-cache", "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, (result.output, result.exception)
    exits = {e["rank"]: e for e in json.loads(result.stdout)["run"]["rank_exits"]}
    assert exits[0]["how"] == "exception" and exits[0]["last_step"] is None
