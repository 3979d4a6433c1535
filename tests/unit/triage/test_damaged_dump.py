"""A hang dump whose stack holds something other than frames (a string, a number: a damaged or crafted file)
is judged from the frames it does hold: diag triage names the hang, never a traceback."""

from __future__ import annotations

import json
import shutil

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
