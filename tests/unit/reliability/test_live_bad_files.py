"""One bad file never stops the live tools or the commands: the dashboard's LiveTrace.refresh, the node agent's
TraceFollower and diag analyze / triage / export skip the file, say so once, and keep every other rank's rows of
the same poll (a Parquet segment with a duplicated column; a rank directory another user cannot read)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from diag.commands.telemetry import TraceFollower
from diag.dashboard.data import LiveTrace
from diag.metrics.prometheus import RowMetrics
from tests.reliability.corpus import SAMPLE


@contextlib.contextmanager
def _unreadable(directory: Path, monkeypatch):
    """The directory at mode 000. As root (this test machine) the kernel still lets us in, so the calls the
    readers make on what is inside it raise PermissionError as they do for any other user: a stand-in, said so."""
    directory.chmod(0)
    if os.geteuid() != 0:
        yield
        directory.chmod(0o755)
        return
    inside = str(directory)

    def guard(real):
        def call(path, *args, **kwargs):
            text = os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike) else ""
            if text == inside and real.__name__ in ("listdir", "scandir") or text.startswith(inside + os.sep):
                raise PermissionError(13, "Permission denied", text)
            return real(path, *args, **kwargs)

        call.__name__ = real.__name__
        return call

    for name in ("stat", "lstat", "open", "listdir", "scandir"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    yield
    monkeypatch.undo()
    directory.chmod(0o755)


def test_a_rank_directory_nobody_may_read_is_named_and_every_command_goes_on(tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    live = LiveTrace(run, poll_interval_s=0.1, triage=False)
    follower = TraceFollower(run, RowMetrics(), host=None)
    runner = CliRunner()
    with _unreadable(run / "rank00001", monkeypatch):
        results = {
            "analyze": runner.invoke(main, ["analyze", str(run), "--no-cache"]),
            "triage": runner.invoke(main, ["triage", str(run)]),
            "export": runner.invoke(main, ["export", str(run), "--perfetto", str(tmp_path / "t.json")]),
        }
        live.refresh()
        follower.poll()
    for name, result in results.items():
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.output)
    assert "rank00001" in results["analyze"].output and "Permission denied" in results["analyze"].output
    # not called a rank killed before its first write (before: "rank 1 recorded no step: killed ...")
    assert "rank 1: files that could not be read" in results["analyze"].output
    assert "recorded no step" not in results["analyze"].output
    assert sorted(live.snapshot.trace.steps["rank"].unique()) == [0, 2]
    # triage cannot call the run clean: nothing of rank 1 was read
    assert results["triage"].exit_code == 2, results["triage"].output
    assert results["triage"].output.startswith("INCOMPLETE: nothing of rank 1 could be read")
    assert "Permission denied" in results["triage"].output
