"""Damaged or crafted watchdog output: a hang dump whose stack holds something other than frames (a string, a
number), an error event without text. diag triage judges what it can read and names the hang, never a
traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.trace.schema import hang_dump_name
from tests.conftest import REPO


def test_triage_of_a_hang_whose_dump_holds_odd_frames_still_names_the_hang(tmp_path):
    run = tmp_path / "hang"
    shutil.copytree(REPO / "sample_traces" / "hang", run)
    path = run / "rank00000" / hang_dump_name(1)
    dump = json.loads(path.read_text())
    dump["threads"][0]["frames"][0] = "\x1b[2J"
    dump["threads"][0]["frames"][1] = 10**30
    path.write_text(json.dumps(dump))
    result = CliRunner().invoke(main, ["triage", str(run)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1 and result.output.startswith("HANG"), result.output


@pytest.mark.parametrize("error", [[], {"x": 1}, None, "absent"])
def test_triage_of_a_hang_whose_step_error_has_no_text_still_names_the_hang(tmp_path, error):
    """A step_error event whose error is not text (the loader drops a list) or is not there at all."""
    run = tmp_path / "hang"
    shutil.copytree(REPO / "sample_traces" / "hang", run)
    path = run / "rank00000" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    raised = next(e for e in events if e["kind"] == "step_error")
    if error == "absent":
        del raised["error"]
    else:
        raised["error"] = error
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    result = CliRunner().invoke(main, ["triage", str(run)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1 and result.output.startswith("HANG"), result.output
