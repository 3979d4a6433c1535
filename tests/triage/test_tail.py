"""``diag triage`` on a large trace reads only each rank's last rows of steps and collectives
(diag/triage/tail.py): the verdict is the one of the whole trace, in both file formats, on a synthetic hang
(benchmarks/synthetic.py --hang: one rank stuck in its data loader, the others in the next all_reduce) and on
the bundled hang sample; only the evidence gains a line saying what was not read."""

from __future__ import annotations

import shutil

import pytest

from diag.trace.schema import CSV_SCHEMA_VERSION, SCHEMA_VERSION
from diag.triage.analysis import triage
from diag.triage.sources import read_diag_trace, tail_rows
from tests.analysis.helpers import synthetic
from tests.conftest import REPO

RANKS, STEPS, PER_STEP = 12, 40, 5


def verdict_of(path, rows_per_rank=None) -> dict:
    return triage(read_diag_trace(path, rows_per_rank)).to_json()


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


def test_bundled_hang_sample_same_verdict_from_its_last_rows(tmp_path):
    run = shutil.copytree(REPO / "sample_traces" / "hang", tmp_path / "hang")
    whole = verdict_of(run)
    for rows in (2, 5):
        assert without_read_note(verdict_of(run, rows_per_rank=rows)) == whole


def test_rows_read_per_rank_shrink_with_the_ranks():
    assert tail_rows(3) >= 10**5  # a small job is read whole
    assert tail_rows(16_384) * 16_384 <= 1_100_000 and tail_rows(16_384) >= 64
