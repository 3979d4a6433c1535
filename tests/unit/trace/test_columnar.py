"""Schema version 2 (diag/trace/columnar.py): Arrow stream segments compacted into Parquet, read while written,
and damage named, never a crash."""

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from diag.trace.cache import load_cached
from diag.trace.columnar import PARQUET_SUFFIX, StreamSegmentWriter, arrow_schema, write_parquet
from diag.trace.loader import TraceReader, load
from diag.trace.schema import STEPS, TELEMETRY, segment_name
from diag.trace.writer import RankWriter
from tests.trace.helpers import step_row as loader_step_row


def step_row(step: int, loss=None) -> tuple:
    return loader_step_row(step, loss=loss, first_start_us=1_795_000_000_000_000)  # a real epoch time


def rank_dir(tmp_path: Path, rank: int = 0) -> Path:
    """A rank directory with its manifest, as diag.init leaves it."""
    path = tmp_path / f"rank{rank:05d}"
    path.mkdir(parents=True, exist_ok=True)
    manifest = {"rank": rank, "world_size": 2 if rank else 1, "run_id": "r", "schema_version": 2}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_live_segment_read_incrementally_through_compaction(tmp_path):
    """Each poll gives only the rows flushed since the last, whether they are in the live stream or, after
    compaction, in the Parquet segment that replaced it (rows already read from the stream are not repeated)."""
    writer = RankWriter(rank_dir(tmp_path), schema_version=2)
    reader = TraceReader(tmp_path)
    seen = []
    for step in range(12):
        writer.append("steps", step_row(step, loss=float(step)))
        writer.flush()
        if step in (4, 9):  # compaction between two polls, as at 65,536 rows
            writer._segments["steps"].compact()
        new = reader.poll()
        assert new["skipped"] == []
        seen += new["steps"]["step"].tolist()
    writer.close()
    assert reader.poll()["steps"].empty
    assert seen == list(range(12))
    assert names(tmp_path / "rank00000") == [
        "manifest.json",
        "steps.000001.parquet",
        "steps.000002.parquet",
        "steps.000003.parquet",
    ]
    assert load(tmp_path).steps["loss"].tolist() == [float(s) for s in range(12)]


def test_half_written_record_batch_is_left_for_the_next_poll(tmp_path):
    segments = StreamSegmentWriter(rank_dir(tmp_path), STEPS)
    segments.append([step_row(0), step_row(1)])
    stream = tmp_path / "rank00000" / "steps.000001.arrows"
    complete = stream.read_bytes()
    segments.append([step_row(2)])
    whole = stream.read_bytes()
    stream.write_bytes(whole[: len(complete) + (len(whole) - len(complete)) // 2])  # the writer is mid-batch
    reader = TraceReader(tmp_path)
    first = reader.poll()
    assert first["steps"]["step"].tolist() == [0, 1] and first["skipped"] == []
    stream.write_bytes(whole)
    assert reader.poll()["steps"]["step"].tolist() == [2]
    segments.abandon()


def test_damaged_segments_are_named_and_the_rest_read(tmp_path):
    good = rank_dir(tmp_path, 0)
    writer = RankWriter(good, schema_version=2)
    for step in range(6):
        writer.append("steps", step_row(step))
        writer.flush()
    writer.close()
    bad = rank_dir(tmp_path, 1)
    # a Parquet segment cut short, then a stream with junk after its first batch
    shutil.copy(good / "steps.000001.parquet", bad / "steps.000001.parquet")
    cut = bad / "steps.000001.parquet"
    cut.write_bytes(cut.read_bytes()[:-64])
    segments = StreamSegmentWriter(bad, STEPS)
    segments.append([step_row(10), step_row(11)])
    segments.abandon()
    stream = bad / "steps.000002.arrows"
    stream.write_bytes(stream.read_bytes() + os.urandom(3000))
    trace = load(tmp_path)
    assert trace.steps.groupby("rank")["step"].apply(list).to_dict() == {0: list(range(6)), 1: [10, 11]}
    reasons = {Path(s.path).name: s.reason for s in trace.skipped}
    assert reasons["steps.000001.parquet"].startswith("unreadable Parquet segment")
    assert reasons["steps.000002.arrows"].startswith("damaged Arrow stream segment from byte")


def test_batches_before_one_that_does_not_decode_are_kept(tmp_path):
    """A full disk: part of a batch's message written, then bytes behind it that frame as a message but decode
    as garbage. The batches before it are read, and the damage named."""
    path = rank_dir(tmp_path)
    segments = StreamSegmentWriter(path, STEPS)
    segments.append([step_row(0), step_row(1)])
    stream = path / "steps.000001.arrows"
    good = stream.read_bytes()
    segments.append([step_row(2)])
    segments.abandon()
    whole = stream.read_bytes()
    batch = whole[len(good) :]
    body_start = len(batch) // 3  # the framing and metadata intact, the compressed body replaced
    stream.write_bytes(good + batch[:body_start] + bytes(len(batch) - body_start))
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1]
    (reason,) = [s.reason for s in trace.skipped if s.path == str(stream)]
    assert reason.startswith("unreadable Arrow stream segment") and reason.endswith("its first 2 rows kept")


def test_a_write_that_failed_part_way_is_cut_from_the_segment(tmp_path):
    """The writer abandoned after a failed flush leaves its live segment at its last whole flush."""
    path = rank_dir(tmp_path)
    segments = StreamSegmentWriter(path, STEPS)
    segments.append([step_row(0)])
    stream = path / "steps.000001.arrows"
    flushed = stream.read_bytes()
    with stream.open("ab") as handle:
        handle.write(b"\xff\xff\xff\xff" + os.urandom(100))  # what a failed write left on the disk
    segments.abandon()
    assert stream.read_bytes() == flushed
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0] and trace.skipped == []


def test_stream_cut_short_before_a_later_segment_is_named(tmp_path):
    """A killed job's live segment that a later run followed will never be finished: its cut batch is damage."""
    path = rank_dir(tmp_path)
    first = StreamSegmentWriter(path, STEPS)
    first.append([step_row(0)])
    first.append([step_row(1)])
    first.abandon()
    stream = path / "steps.000001.arrows"
    stream.write_bytes(stream.read_bytes()[:-40])
    second = StreamSegmentWriter(path, STEPS)
    second.append([step_row(0)])
    second.close()
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0]  # the second run (steps start again: the latest run is kept)
    assert any("incomplete message" in s.reason and s.path == str(stream) for s in trace.skipped)


def test_segment_of_another_table_or_not_arrow_is_refused_by_name(tmp_path):
    path = rank_dir(tmp_path)
    telemetry = pa.table({c.name: pa.nulls(3, t.type) for c, t in zip(TELEMETRY.columns, arrow_schema(TELEMETRY))})
    write_parquet(TELEMETRY, telemetry, path / segment_name("steps", 1, PARQUET_SUFFIX))
    (path / "steps.000002.arrows").write_bytes(b"#diag-trace schema=1 table=steps\nstep,start_us\n")
    trace = load(tmp_path)
    reasons = {Path(s.path).name: s.reason for s in trace.skipped}
    assert reasons["steps.000001.parquet"] == "schema version 2 table 'telemetry', expected version 2 'steps'"
    assert "not an Arrow IPC message" in reasons["steps.000002.arrows"]
    assert trace.steps.empty


def test_segment_written_before_a_column_was_added_reads_it_empty(tmp_path):
    path = rank_dir(tmp_path)
    older = STEPS.leading(len(STEPS.columns) - 3)  # before loss, grad_norm and param_fingerprint
    arrow = pa.Table.from_pylist([dict(zip(older.column_names, step_row(s))) for s in range(3)], arrow_schema(older))
    write_parquet(older, arrow, path / segment_name("steps", 1, PARQUET_SUFFIX))
    trace = load(tmp_path)
    assert trace.skipped == [] and trace.steps["step"].tolist() == [0, 1, 2]
    assert trace.steps["loss"].isna().all() and str(trace.steps["loss"].dtype) == "Float64"


def test_a_csv_run_then_a_v2_run_in_one_directory_are_both_read(tmp_path):
    path = rank_dir(tmp_path)
    csv = RankWriter(path, schema_version=1)
    csv.append("steps", step_row(0))
    csv.close()
    columnar = RankWriter(path, schema_version=2)
    columnar.append("steps", step_row(1))
    columnar.close()
    assert names(path) == ["manifest.json", "steps.000001.parquet", "steps.csv"]
    assert load(tmp_path).steps["step"].tolist() == [0, 1]


def test_cache_serves_a_v2_trace_and_notices_compaction(tmp_path):
    writer = RankWriter(rank_dir(tmp_path), schema_version=2)
    writer.append("steps", step_row(0))
    writer.flush()
    assert load_cached(tmp_path)[1] == "loaded+cached"
    assert load_cached(tmp_path)[1] == "cache"
    writer.append("steps", step_row(1))
    writer.close()  # compacted: the files changed, the cache entry is stale
    trace, how = load_cached(tmp_path)
    assert how == "loaded+cached" and trace.steps["step"].tolist() == [0, 1]


def test_values_of_the_wrong_type_are_coerced_or_dropped_not_fatal(tmp_path):
    """What capture hands the writer is not checked on the training thread: a bool flag, an integral float, a
    number as a category; a value that cannot be its column's drops its row (counted), as a garbled CSV row."""
    writer = RankWriter(rank_dir(tmp_path), schema_version=2)
    writer.append("steps", step_row(0)._replace(samples=True, forward_us=5000.0))
    writer.append("steps", step_row(1)._replace(start_us="not a number"))
    writer.close()
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0]
    assert trace.steps["samples"].tolist() == [1] and trace.steps["forward_us"].tolist() == [5000]
    assert [(s.reason, s.lines) for s in trace.skipped] == [("steps: rows without a required value skipped", 1)]


def test_kill_between_compaction_and_removal_reads_each_row_once(tmp_path):
    """Compaction renames the Parquet segment into place, then removes the stream: killed in between, both
    exist, and the Parquet one (the same rows) is read."""
    path = rank_dir(tmp_path)
    segments = StreamSegmentWriter(path, STEPS)
    segments.append([step_row(0), step_row(1)])
    stream = path / "steps.000001.arrows"
    live = stream.read_bytes()
    segments.close()
    stream.write_bytes(live)  # as if the process died before unlinking it
    trace = load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1] and trace.skipped == []
    assert names(path) == ["manifest.json", "steps.000001.arrows", "steps.000001.parquet"]


def test_synthetic_trace_in_v2_loads_the_same_frames_as_in_csv(tmp_path):
    """diag.testing.synthetic --format 2 (the scale benchmarks' traces): the same rows, types and report."""
    from tests.analysis.helpers import synthetic

    for trace_format in (1, 2):
        synthetic.generate(tmp_path / f"v{trace_format}", 8, 40, 5, trace_format=trace_format)
    csv, columnar = load(tmp_path / "v1"), load(tmp_path / "v2")
    assert not list((tmp_path / "v2").glob("rank*/*.csv")) and csv.skipped == columnar.skipped == []
    for table in ("steps", "collectives", "memory", "telemetry"):
        expected, actual = getattr(csv, table), getattr(columnar, table)
        assert len(expected) and list(expected.dtypes.astype(str)) == list(actual.dtypes.astype(str))
        assert expected.astype(object).equals(actual.astype(object)), table


def test_capture_writes_schema_2_by_default_and_csv_when_asked(tmp_path):
    import diag

    for trace_dir, options in ((tmp_path / "default", {}), (tmp_path / "csv", {"trace_format": 1})):
        diag.init(trace_dir, telemetry=False, watchdog=False, **options)
        for _ in range(3):
            with diag.step():
                pass
        diag.finish()
    default_files = sorted(p.name for p in (tmp_path / "default" / "rank00000").glob("steps*"))
    csv_files = sorted(p.name for p in (tmp_path / "csv" / "rank00000").glob("steps*"))
    assert default_files == ["steps.000001.parquet"] and csv_files == ["steps.csv"]
    for trace_dir in ("default", "csv"):
        trace = diag.load(tmp_path / trace_dir)
        assert trace.steps["step"].tolist() == [0, 1, 2]
    assert json.loads((tmp_path / "default" / "rank00000" / "manifest.json").read_text())["schema_version"] == 2


def test_stream_whose_lengths_claim_2_to_the_40_rows_is_refused_with_the_reason(tmp_path):
    path = rank_dir(tmp_path)
    segments = StreamSegmentWriter(path, STEPS)
    segments.append([step_row(0), step_row(1), step_row(2)])
    segments.abandon()
    stream = path / "steps.000001.arrows"
    data = stream.read_bytes()
    stream.write_bytes(data.replace((3).to_bytes(8, "little"), (1 << 40).to_bytes(8, "little")))
    trace = load(tmp_path)
    assert trace.steps.empty
    assert any("unreadable Arrow stream segment" in s.reason for s in trace.skipped)
