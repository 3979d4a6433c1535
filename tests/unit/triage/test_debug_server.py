"""Triage of PyTorch's debug server's periodic dumps (diag/triage/debug_server.py): a real job's, and recorded ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diag.trace.loader import TraceError
from diag.triage.analysis import triage
from diag.triage.sources import read_input

PARTIAL = "stacks_20261128_162021.txt"  # rank 2 frozen: "PARTIAL DATA: 2/3", rank 2 timed out
FIXTURES = Path(__file__).parents[2] / "fixtures" / "debug_server"
COMPLETE = "stacks_20261128_162012.txt"  # every rank answered; rank 2 in wait_for_slow_input


def _copy(tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "dumps"
    out.mkdir()
    for name in names:
        shutil.copy(FIXTURES / name, out / name)
    return out


def test_recorded_dump_names_rank_2_and_its_sleeping_function(tmp_path):
    data = read_input(_copy(tmp_path, COMPLETE))
    result = triage(data)
    assert (result.verdict, result.culprit_ranks) == ("missing_ranks", [2]), result.evidence
    assert result.ranks[2].stack[-1].endswith("in wait_for_slow_input")
    assert result.ranks[2].state == "stuck_in_compute"


def test_rank_missing_from_the_latest_dump_falls_back_to_the_latest_complete_one(tmp_path):
    partial = PARTIAL
    data = read_input(_copy(tmp_path, COMPLETE, partial))
    assert any(COMPLETE in n and partial in n and "lacks ranks [2]" in n for n in data.notes), data.notes
    assert (triage(data).culprit_ranks) == [2]


def test_partial_dump_alone_treats_the_silent_rank_as_one_without_a_dump(tmp_path):
    partial = PARTIAL
    data = read_input(_copy(tmp_path, partial))
    assert data.ranks[2].has_data is False
    assert any("did not answer" in n and "rank 2" in n for n in data.notes), data.notes
    assert data.ranks[0].last_dump is not None


def test_corrupt_latest_dump_is_skipped_with_its_reason(tmp_path):
    out = _copy(tmp_path, COMPLETE)
    (out / "stacks_20261128_235959.txt").write_bytes(b"\x00\xff garbage, no rank sections\n")
    data = read_input(out)
    assert [Path(s.path).name for s in data.skipped] == ["stacks_20261128_235959.txt"]
    assert "no '=== Rank N" in data.skipped[0].reason
    assert triage(data).culprit_ranks == [2]


def test_only_corrupt_dumps_give_a_clear_error(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    (out / "stacks_20261128_235959.txt").write_text("not a dump\n")
    with pytest.raises(TraceError, match="no readable stacks dump"):
        read_input(out)


def test_empty_directory_gives_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="neither a diag trace"):
        read_input(tmp_path)
