"""``diag export --perfetto --steps A:B`` reads only the row groups and record batches whose steps meet the window,
and writes exactly what it wrote before: the same file, byte for byte, as the export through the loader's pandas
path (``windowed=False``), whose events are those of the whole loaded trace cut to the window."""

from __future__ import annotations

import json
import shutil

from tests.analysis.helpers import synthetic


def test_cli_export_steps(tmp_path):
    """The command itself (windowed by default) writes the window's events."""
    from click.testing import CliRunner

    from diag.commands.export import command

    run = tmp_path / "cli"
    synthetic.generate(run, 3, 50, 4, trace_format=2)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(command, [str(run), "--perfetto", str(out), "--steps", "10:12"])
    assert result.exit_code == 0, result.output
    events = json.loads(out.read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if e["ph"] == "X" and e["name"].startswith("step ")})
    assert steps == ["step 10", "step 11"]
    shutil.rmtree(run)
