"""One bad file never stops the live tools or the commands: the dashboard's LiveTrace.refresh, the node agent's
TraceFollower and diag analyze / triage / export skip the file, say so once, and keep every other rank's rows of
the same poll (a Parquet segment with a duplicated column; a rank directory another user cannot read)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from diag.cli import main
from diag.commands.telemetry import TraceFollower
from diag.dashboard.data import LiveTrace
from diag.metrics.prometheus import RowMetrics
from tests.reliability.corpus import SAMPLE

STEP_ROW = "{step},{start},1000,5,100,200,50,40,,64,\n"


def _append_steps(rank_dir: Path, first: int, count: int) -> None:
    with open(rank_dir / "steps.csv", "a") as f:
        for step in range(first, first + count):
            f.write(STEP_ROW.format(step=step, start=1_795_385_990_000_000 + step * 2000))


def _duplicate_a_column(path: Path) -> None:
    table = pq.read_table(path)
    names = [*table.column_names, "step"]
    doubled = pa.Table.from_arrays([*table.columns, table.column("step")], names=names)
    pq.write_table(doubled.replace_schema_metadata(table.schema.metadata), path)  # still marked as diag's


def test_a_segment_with_a_duplicated_column_is_skipped_and_the_other_ranks_of_the_poll_kept(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    live = LiveTrace(run, poll_interval_s=0.1, triage=False)
    metrics = RowMetrics()
    follower = TraceFollower(run, metrics, host=None)
    live.refresh()
    follower.poll()
    before = live.snapshot.trace.steps.groupby("rank").size().to_dict()
    # in one poll: rank 0 gets a crafted segment, rank 1 ten new steps
    _to_columnar_rank(run / "rank00000")
    _duplicate_a_column(run / "rank00000" / "steps.000001.parquet")
    _append_steps(run / "rank00001", 100, 10)
    live.refresh()  # "never raises"
    follower.poll()  # the agent's loop goes on
    deadline = time.monotonic() + 60
    while live.snapshot.trace.steps["rank"].eq(1).sum() == before[1] and time.monotonic() < deadline:
        time.sleep(0.2)  # a new snapshot is published at most every twice the time the last analysis took
        live.refresh()
    after = live.snapshot.trace.steps.groupby("rank").size().to_dict()
    assert after[1] == before[1] + 10
    said = " ".join(str(s) for s in live.snapshot.trace.skipped)
    assert "steps.000001.parquet" in said and "appears more than once" in said
    assert live.snapshot.error is None
    assert "appears more than once" in capsys.readouterr().err  # the agent said it


def _to_columnar_rank(rank_dir: Path) -> None:
    """Only this rank's steps as a Parquet segment: the other files stay CSV."""
    from diag.trace.columnar import PARQUET_SUFFIX, write_parquet
    from diag.trace.loader import read_table_arrow
    from diag.trace.schema import TABLES, segment_name

    arrow = read_table_arrow(rank_dir / "steps.csv", TABLES["steps"]).table
    (rank_dir / "steps.csv").unlink()
    write_parquet(TABLES["steps"], arrow, rank_dir / segment_name("steps", 1, PARQUET_SUFFIX))


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
    assert sorted(live.snapshot.trace.steps["rank"].unique()) == [0, 2]
