"""A capture that stopped before its first write (a disk already full) leaves a manifest that says so and no
rows: diag analyze's 'nothing could be analysed' names where and why capture stopped, not only that nothing
is there."""

from __future__ import annotations

from click.testing import CliRunner

from diag.cli import main
from diag.trace.writer import RankWriter

STOPPED = {"step": 78, "last_step": 77, "reason": "disk full", "time_us": 1_795_996_947_813_679}


def test_nothing_to_analyse_says_capture_stopped_before_its_first_write(tmp_path):
    writer = RankWriter(tmp_path / "rank00000")
    writer.write_manifest({"rank": 0, "world_size": 1, "schema_version": 2, "capture_stopped": STOPPED})
    writer.close()
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "nothing in" in result.output and "could be analysed" in result.output
    assert "capture stopped at step 78 (disk full) on rank 0" in result.output, result.output
