"""One bad file never stops the live tools or the commands: the dashboard's LiveTrace.refresh, the node agent's
TraceFollower and diag analyze / triage / export skip the file, say so once, and keep every other rank's rows of
the same poll (a Parquet segment with a duplicated column; a rank directory another user cannot read)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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
