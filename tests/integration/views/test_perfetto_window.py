"""``diag export --perfetto --steps A:B`` reads only the row groups and record batches whose steps meet the window,
and writes exactly what it wrote before: the same file, byte for byte, as the export through the loader's pandas
path (``windowed=False``), whose events are those of the whole loaded trace cut to the window."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import diag
from diag.launch import run_ranks
from diag.trace import columnar
from diag.trace.loader import TraceReader
from diag.trace.schema import TABLES
from diag.views.perfetto import EXPORT_TABLES, write_chrome_trace, write_chrome_trace_dir
from tests.analysis.helpers import synthetic
from tests.conftest import REPO
from tests.views.helpers import assert_honest_timeline

JOB = REPO / "tests" / "views" / "export_job.py"
JOB_STEPS = 40
WINDOWS = (None, (0, 1), (5, 9), (23, 26), (30, 100), (100, 200))


def exported(run, tmp_path, steps, windowed: bool, ranks=None):
    out = tmp_path / f"{'windowed' if windowed else 'pandas'}.json"
    count, written, skipped = write_chrome_trace_dir(run, out, steps, ranks, windowed=windowed)
    return out.read_bytes(), count, written, [str(s) for s in skipped]


def assert_same_export(run, tmp_path, windows=WINDOWS, ranks=None):
    """The windowed export's file equals the pandas path's byte for byte (and its notes), and its events are the
    whole loaded trace's cut to the window."""
    trace = diag.load(run)
    for steps in windows:
        new, count, written, notes = exported(run, tmp_path, steps, True, ranks)
        old, old_count, old_written, old_notes = exported(run, tmp_path, steps, False, ranks)
        assert new == old, (run.name, steps)
        assert (count, written, notes) == (old_count, old_written, old_notes), (run.name, steps)
        write_chrome_trace(trace, tmp_path / "whole.json", steps, ranks)
        whole = json.loads((tmp_path / "whole.json").read_text())["traceEvents"]
        key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731 - events are dicts: compare as text
        assert sorted(map(key, json.loads(new)["traceEvents"])) == sorted(map(key, whole)), (run.name, steps)
        assert count == len(whole) > 0
        assert_honest_timeline(whole)


def windowed_rows(run, rank: int, name: str, window) -> tuple[list, list]:
    """(rows a windowed read returns, rows of a whole read) of one rank's table, as step or time values."""
    column = "time_us" if name == "telemetry" else "step"
    rank_dir = run / f"rank{rank:05d}"
    pruned = TraceReader(run, tables=(name,))
    pruned.windows = {name: (column, *window)}
    part = pruned.read_rank_tables(rank, rank_dir, (name,), [])[name].column(column).to_pylist()
    whole = TraceReader(run, tables=(name,)).read_rank_tables(rank, rank_dir, (name,), [])[name]
    return part, whole.column(column).to_pylist()


def assert_pruned(run, rank: int, name: str, low: int, high: int):
    """A windowed read returns every row of the window and fewer rows than the table holds."""
    part, whole = windowed_rows(run, rank, name, (low, high))
    assert sorted(v for v in part if low <= v <= high) == sorted(v for v in whole if low <= v <= high)
    assert any(low <= v <= high for v in whole) and len(part) < len(whole), (name, len(part), len(whole))


@pytest.fixture(scope="module")
def job_runs(tmp_path_factory):
    """The real job twice: finished (compacted segments, row groups of 8 rows) and left as a killed job leaves
    it (each table's last segment a live stream of one record batch per flush)."""
    runs = {}
    for mode in ("finish", "killed"):
        run = tmp_path_factory.mktemp("export") / mode
        results = run_ranks([str(JOB), str(run), str(JOB_STEPS), mode], 2, timeout_s=180)
        for result in results:
            assert result.returncode == 0, result.stderr[-3000:]
        runs[mode] = run
    return runs


@pytest.mark.slow
def test_real_job_compacted_segments_in_row_groups(job_runs, tmp_path):
    run = job_runs["finish"]
    metadata = pq.ParquetFile(run / "rank00000" / "steps.000001.parquet").metadata
    assert metadata.num_row_groups >= 3 and len(list((run / "rank00000").glob("collectives.*.parquet"))) >= 2
    assert not list(run.glob("rank*/*.arrows"))
    assert_pruned(run, 0, "steps", 5, 8)
    assert_pruned(run, 1, "collectives", 30, 35)
    assert_same_export(run, tmp_path)
    assert_same_export(run, tmp_path, windows=((5, 9),), ranks=[1])


@pytest.mark.slow
def test_real_job_killed_with_live_streams_of_a_batch_per_flush(job_runs, tmp_path):
    run = job_runs["killed"]
    stream = run / "rank00000" / "steps.000002.arrows"
    assert stream.exists()
    import pyarrow.ipc as ipc

    assert len(list(ipc.open_stream(stream.read_bytes()))) >= 8  # one batch per flush
    assert_pruned(run, 0, "steps", 30, 32)  # batches of the live stream
    assert_pruned(run, 0, "steps", 5, 8)  # row groups of the compacted segment, the stream's batches skipped
    assert_same_export(run, tmp_path)


def test_synthetic_schema_2_in_many_row_groups_with_telemetry(tmp_path, monkeypatch):
    """diag.testing.synthetic writes a rank as one Parquet segment per table; in row groups of 16 rows here, so
    collectives (4 a step), steps and telemetry samples (timed, windowed by the steps' span) all have many."""
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 16)
    run = tmp_path / "s2"
    synthetic.generate(run, 6, 200, 4, trace_format=2)
    assert pq.ParquetFile(run / "rank00002" / "collectives.000001.parquet").metadata.num_row_groups > 10
    assert pq.ParquetFile(run / "rank00002" / "telemetry.000001.parquet").metadata.num_row_groups > 2
    assert_pruned(run, 2, "collectives", 100, 104)
    assert_pruned(run, 2, "steps", 100, 104)
    telemetry = diag.load(run).telemetry["time_us"]
    middle = int(telemetry.quantile(0.5))
    assert_pruned(run, 2, "telemetry", middle, middle + 1_000_000)
    assert_same_export(run, tmp_path, windows=(None, (0, 1), (63, 65), (100, 110), (199, 300)))


def test_schema_1_csv(tmp_path):
    """CSV has no row groups: read whole, then cut; the same file as before."""
    run = tmp_path / "s1"
    synthetic.generate(run, 4, 60, 4, trace_format=1)
    assert list(run.glob("rank00000/*.csv"))
    assert_same_export(run, tmp_path, windows=(None, (10, 12), (59, 70)))
    assert_same_export(REPO / "sample_traces" / "pipeline", tmp_path, windows=((1, 3),))


def test_segment_without_statistics_is_read_whole(tmp_path, monkeypatch):
    """A Parquet segment written without column statistics (another writer, an older one): no row group can be
    skipped, the segment is read whole, and the export is still the same."""
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 64)
    run = tmp_path / "nostats"
    synthetic.generate(run, 3, 120, 4, trace_format=2)
    path = run / "rank00001" / "collectives.000001.parquet"
    arrow = pq.read_table(path)
    options = {**columnar.parquet_options(TABLES["collectives"]), "write_statistics": False}
    with pq.ParquetWriter(path, arrow.schema, **options) as writer:
        writer.write_table(arrow, row_group_size=64)
        writer.add_key_value_metadata({columnar.MARKER_KEY: columnar.marker(TABLES["collectives"]).encode()})
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups > 1 and not metadata.row_group(0).column(0).is_stats_set
    assert columnar.row_groups_meeting(metadata, "step", 50, 52) is None
    part, whole = windowed_rows(run, 1, "collectives", (50, 52))
    assert part == whole  # read whole
    assert_pruned(run, 0, "collectives", 50, 52)  # the other ranks' segments still skip row groups
    assert_same_export(run, tmp_path, windows=((50, 53), (0, 2)))


def test_a_rank_whose_files_hold_a_second_run_goes_through_the_loader(tmp_path):
    """Rank 1's schema-2 files hold a first run then a second one appended (steps start again at 0, later): the
    windowed read cannot know which rows are the earlier run's without the whole steps, so that rank goes
    through the loader's cut; the file is the same."""
    run = tmp_path / "twice"
    synthetic.generate(run, 3, 40, 4, trace_format=2)
    again = tmp_path / "again"
    synthetic.generate(again, 3, 40, 4, trace_format=2, seed=1)
    rank_dir = run / "rank00001"
    for name in EXPORT_TABLES:
        for segment in sorted((again / "rank00001").glob(f"{name}.*.parquet")):
            later = pq.read_table(segment)
            for column in ("start_us", "time_us"):
                if column in later.column_names:
                    index = later.column_names.index(column)
                    shifted = [v + 3_600_000_000 for v in later.column(column).to_pylist()]
                    later = later.set_column(index, column, __import__("pyarrow").array(shifted, "int64"))
            columnar.write_parquet(TABLES[name], later, rank_dir / segment.name.replace(".000001.", ".000002."))
    trace = diag.load(run)
    assert any("start again" in s.reason for s in trace.skipped)
    assert_same_export(run, tmp_path, windows=(None, (2, 5), (30, 40)))
