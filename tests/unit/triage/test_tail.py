"""``diag triage`` on a large trace reads only each rank's last rows of steps and collectives
(diag/triage/tail.py): the verdict is the one of the whole trace, in both file formats, on a synthetic hang
(diag.testing.synthetic --hang: one rank stuck in its data loader, the others in the next all_reduce) and on
the bundled hang sample; only the evidence gains a line saying what was not read."""

from __future__ import annotations

import json

from diag.trace import columnar
from diag.trace.columnar import StreamSegmentWriter
from diag.trace.loader import TraceReader
from diag.trace.schema import TABLES
from diag.triage.analysis import triage
from diag.triage.sources import read_diag_trace, tail_rows
from tests.analysis.helpers import synthetic
from tests.trace.helpers import step_row

RANKS, STEPS, PER_STEP = 12, 40, 5


def verdict_of(path, rows_per_rank=None, heartbeats=False) -> dict:
    """The verdict from each rank's last rows (``heartbeats`` False: the synthetic generator's heartbeats would otherwise
    decide its hang without a table read, test_heartbeat_summary.py)."""
    return triage(read_diag_trace(path, rows_per_rank, heartbeats=heartbeats)).to_json()


def without_read_note(verdict: dict) -> dict:
    return {**verdict, "evidence": [e for e in verdict["evidence"] if "have more records than triage reads" not in e]}


def test_tail_of_a_csv_file_with_a_damaged_row_near_its_end(tmp_path):
    """The rows read from the end go through the loader's checks: a corrupt row is skipped and counted."""
    synthetic.generate(tmp_path, 4, STEPS, PER_STEP, hang=True)
    path = tmp_path / "rank00001" / "collectives.csv"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[-3] = b"garbage,not,a,row\n"
    path.write_bytes(b"".join(lines))
    whole = verdict_of(tmp_path, rows_per_rank=10**9)
    tail = verdict_of(tmp_path, rows_per_rank=10)
    assert any("corrupt rows skipped (1 rows)" in s or "corrupt rows" in s for s in tail["skipped"]), tail["skipped"]
    assert without_read_note(tail)["verdict"] == whole["verdict"] == "missing_ranks"
    assert tail["culprit_ranks"] == whole["culprit_ranks"]


def test_rows_read_per_rank_shrink_with_the_ranks():
    assert tail_rows(3) >= 10**5  # a small job is read whole
    assert tail_rows(16_384) * 16_384 <= 1_100_000 and tail_rows(16_384) >= 64


def test_tail_of_compacted_segments_and_a_live_stream(tmp_path, monkeypatch):
    """What capture leaves of a job still running: Parquet segments compacted every 40 rows (in row groups of 8
    rows), then the live Arrow stream of the last flushes (5 rows each). A tail read goes from the newest back
    and gives the last rows exactly as the whole read does, decoding at most one row group or record batch more
    than asked."""
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 8)
    path = tmp_path / "rank00000"
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"rank": 0, "world_size": 1, "run_id": "r", "schema_version": 2}))
    writer = StreamSegmentWriter(path, TABLES["steps"], compact_rows=40)
    for flush in range(27):  # segments 1-3 compacted (40 rows each), segment 4 live: 3 record batches, 15 rows
        writer.append([step_row(flush * 5 + i) for i in range(5)])
    assert sorted(p.suffix for p in path.glob("steps.*")) == [".arrows", ".parquet", ".parquet", ".parquet"]
    names = sorted(p.name for p in path.iterdir())
    total = 135
    whole = TraceReader(tmp_path).poll()["steps"]["step"].tolist()
    assert whole == list(range(total))
    for rows in (1, 5, 6, 11, 15, 16, 17, 45, 129, total, 1000):
        reader, skipped = TraceReader(tmp_path, tables=()), []
        arrow, cut = reader.read_segments_tail(path, names, TABLES["steps"], rows, skipped)
        steps = arrow.column("step").to_pylist()
        assert skipped == []
        assert steps == whole[-len(steps) :] and len(steps) >= min(rows, total), rows
        assert len(steps) < rows + 8, rows  # one record batch (5 rows) or one row group (8 rows) beyond
        assert cut == (len(steps) < total), rows
    writer.close()
