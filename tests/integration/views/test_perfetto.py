"""``diag export --perfetto``: a real run's ranks on one aligned Chrome-trace timeline."""

import json

from tests.conftest import REPO

# -- what the timeline shows: nested phases, collectives timed or estimated, flows between ranks -----------------


def test_messages_from_trace_files_print_no_control_characters(tmp_path):
    """A run whose folder name and manifest hold terminal escapes (a cleared screen, a window title): the notes
    and the summary on stderr show them escaped."""
    import shutil
    import subprocess
    import sys

    run = shutil.copytree(REPO / "sample_traces" / "hang", tmp_path / "run\x1b[2J")
    manifest_path = run / "rank00000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["world_size"] = "\x1b]0;pwned\x07"
    manifest_path.write_text(json.dumps(manifest))
    stderr = {}
    for name, extra in (("export", []), ("absent rank", ["--ranks", "9"])):
        result = subprocess.run(
            [sys.executable, "-m", "diag", "export", str(run), "--perfetto", str(tmp_path / "o.json"), *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert result.returncode == (2 if extra else 0), result.stderr
        stderr[name] = result.stderr
    for text in stderr.values():
        assert "\x1b" not in text and "\x07" not in text
        assert "run\\x1b[2J" in text
    assert "world_size in manifests (\\x1b]0;pwned\\x07)" in stderr["export"]
