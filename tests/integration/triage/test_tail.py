"""``diag triage`` on a large trace reads only each rank's last rows of steps and collectives
(diag/triage/tail.py): the verdict is the one of the whole trace, in both file formats, on a synthetic hang
(diag.testing.synthetic --hang: one rank stuck in its data loader, the others in the next all_reduce) and on
the bundled hang sample; only the evidence gains a line saying what was not read."""

from __future__ import annotations

import shutil

import pytest

from diag.trace import columnar
from diag.trace.schema import CSV_SCHEMA_VERSION, SCHEMA_VERSION
from diag.triage.analysis import triage
from diag.triage.sources import read_diag_trace
from tests.analysis.helpers import synthetic
from tests.conftest import REPO

RANKS, STEPS, PER_STEP = 12, 40, 5


def verdict_of(path, rows_per_rank=None, heartbeats=False) -> dict:
    """The verdict from each rank's last rows (``heartbeats`` False: the synthetic generator's heartbeats would otherwise
    decide its hang without a table read, test_heartbeat_summary.py)."""
    return triage(read_diag_trace(path, rows_per_rank, heartbeats=heartbeats)).to_json()


def without_read_note(verdict: dict) -> dict:
    return {**verdict, "evidence": [e for e in verdict["evidence"] if "have more records than triage reads" not in e]}


@pytest.mark.parametrize("trace_format", [CSV_SCHEMA_VERSION, SCHEMA_VERSION], ids=["csv", "v2"])
def test_tail_of_each_rank_gives_the_whole_traces_verdict(tmp_path, trace_format):
    plants = synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=trace_format, hang=True)
    whole = verdict_of(tmp_path, rows_per_rank=10**9)
    assert whole["verdict"] == "missing_ranks" and whole["culprit_ranks"] == [plants.hang_stuck]
    assert whole["collective"]["seq"] == STEPS * PER_STEP + 1
    assert whole["ranks"][str(plants.hang_stuck)]["state"] == "stuck_in_data_loader"
    for rows in (1, 7, PER_STEP * 3):  # less than a step, a step and a bit, three steps
        tail = verdict_of(tmp_path, rows_per_rank=rows)
        assert any(f"only the last {rows} steps and collectives" in e for e in tail["evidence"])
        assert without_read_note(tail) == whole, rows


def test_bundled_hang_sample_same_verdict_from_its_last_rows(tmp_path):
    run = shutil.copytree(REPO / "sample_traces" / "hang", tmp_path / "hang")
    whole = verdict_of(run)
    for rows in (2, 5):
        assert without_read_note(verdict_of(run, rows_per_rank=rows)) == whole


def test_tail_of_parquet_segments_in_many_row_groups(tmp_path, monkeypatch):
    """Segments written in row groups of 16 rows (ROW_GROUP_ROWS is 4,096; smaller here so a small trace has
    many): a tail read decodes only the last row groups and gives the whole trace's verdict."""
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 16)
    plants = synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    whole = verdict_of(tmp_path, rows_per_rank=10**9)
    assert whole["verdict"] == "missing_ranks" and whole["culprit_ranks"] == [plants.hang_stuck]
    for rows in (1, 15, 16, 17, 33):
        assert without_read_note(verdict_of(tmp_path, rows_per_rank=rows)) == whole, rows
