"""The dashboard above 64 ranks and `diag analyze`'s report cache (TRACE_DIR/.diag-cache): the server reads the
report diag analyze cached for the files as they are (the same report as computing it, and nothing computed), a
report the server computed is the one a later `diag analyze` reads, and a trace changed since (a row appended to
one rank's file) is analysed again, never served the old report. Small synthetic traces in the real file format
(72 ranks: above PARTITIONED_MIN_RANKS, so the server takes the partitioned path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.dashboard.data import LiveTrace, report_cache_name
from diag.trace.cache import CACHE_DIR, TraceCache
from diag.trace.schema import TABLES
from tests.analysis.golden import differences
from tests.analysis.helpers import run_cli, synthetic

pytestmark = pytest.mark.slow
RANKS, STEPS, PER_STEP = 72, 12, 4


@pytest.fixture
def run(tmp_path) -> Path:
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP)  # CSV tables: a row is appended as text below
    return tmp_path


def analyze_json(path: Path, *options: str) -> tuple[dict, str]:
    result = run_cli(path, "--format", "json", *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def load(path: Path, cache: bool = True) -> tuple[LiveTrace, list]:
    published = []
    live = LiveTrace(path, poll_interval_s=3600, triage=False, cache=cache)
    live.prepare = published.append
    live.refresh()
    return live, published


def append_step(path: Path, rank: int) -> None:
    """One more step on ``rank``, appended to its steps.csv as a running job appends it (the CSV has no header:
    its columns are the schema's)."""
    steps = path / f"rank{rank:05d}" / "steps.csv"
    last = steps.read_text().splitlines()[-1].split(",")
    step_at = [c.name for c in TABLES["steps"].columns].index("step")
    last[step_at] = str(int(last[step_at]) + 1)
    with steps.open("a") as out:
        out.write(",".join(last) + "\n")


def cached_entries(path: Path) -> list[Path]:
    return sorted((path / CACHE_DIR).glob(f"*/{report_cache_name()}.json"))


def test_the_server_reads_the_report_diag_analyze_cached(run):
    cold, _ = analyze_json(run)  # computes, and caches its report under the files' signature
    assert len(cached_entries(run)) == 1
    live, published = load(run)
    snap = live.snapshot
    assert live.partitioned and snap.report_source == "cache"
    # no snapshot before the report (it was there at once); then the memory and telemetry views
    assert [(s.report is None, s.views_pending) for s in published] == [(False, True), (False, False)]
    assert not snap.analysing
    assert differences(snap.report.to_dict(), cold) == []
    computed, _ = load(run, cache=False)
    assert computed.snapshot.report_source == "computed"
    assert differences(snap.report.to_dict(), computed.snapshot.report.to_dict()) == []
    # every step's times: the same rows, the waits those the ranks measured (the collectives are not read)
    assert len(snap.times) == len(computed.snapshot.times) == RANKS * STEPS


def test_a_report_the_server_computed_is_the_one_diag_analyze_reads(run):
    live, _ = load(run)
    assert live.snapshot.report_source == "computed" and len(cached_entries(run)) == 1
    assert cached_entries(run)[0].parent.name == TraceCache(run).key  # the key of the files as they are
    again, stderr = analyze_json(run)
    assert "report read from the cache" in stderr
    fresh, _ = analyze_json(run, "--no-cache")
    assert differences(again, fresh) == []
    assert differences(live.snapshot.report.to_dict(), fresh) == []


def test_a_trace_changed_since_is_analysed_again(run):
    analyze_json(run)
    old_key = cached_entries(run)[0].parent.name
    append_step(run, 5)
    live, published = load(run)
    assert live.snapshot.report_source == "computed"
    # the ranks and the preliminary report from their steps first, the full report after
    assert [s.report_source for s in published] == ["preliminary", "computed", "computed"]
    fresh, _ = analyze_json(run, "--no-cache")
    assert differences(live.snapshot.report.to_dict(), fresh) == []
    [entry] = cached_entries(run)  # the stale entry removed, the new report cached under the new key
    assert entry.parent.name != old_key and entry.parent.name == TraceCache(run).key


def test_rows_appended_after_the_read_are_neither_served_nor_cached(run):
    """The signature is taken after the last read: a row appended in between makes the tables newer than the
    key, so that publication neither reads nor writes the cache (the row is kept for it)."""
    live, _ = load(run, cache=True)
    before = len(live.snapshot.trace.steps)
    append_step(run, 7)
    assert live._report_cache() == (None, None)
    live._next_publish_s = 0.0
    live._dirty = True
    live._publish()
    assert len(live.snapshot.trace.steps) == before + 1 and live.snapshot.report_source == "computed"


def test_a_planted_or_damaged_report_is_recomputed(run):
    analyze_json(run)
    [entry] = cached_entries(run)
    entry.write_text(json.dumps({"report_version": 1, "run": "not a run"}))  # not a report: never served
    live, _ = load(run)
    assert live.snapshot.report_source == "computed"
    fresh, _ = analyze_json(run, "--no-cache")
    assert differences(live.snapshot.report.to_dict(), fresh) == []


def test_a_server_started_before_its_first_load_loads_on_the_poll_thread(run):
    """diag dashboard on many ranks serves at once and loads on the poll thread: its first read comes at once,
    not after a poll interval (an hour here)."""
    import time

    live = LiveTrace(run, poll_interval_s=3600, triage=False, cache=False)
    assert live.snapshot.version == 0 and live.snapshot.run_state == "loading"
    live.start()
    try:
        deadline = time.monotonic() + 120
        while live.snapshot.report_source != "computed" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert live.snapshot.report is not None and live.snapshot.report_source == "computed"
        assert len(live.snapshot.trace.ranks_found) == RANKS
    finally:
        live.stop()


@pytest.mark.parametrize("trace_format", [1, 2])
def test_the_first_read_in_worker_processes_is_the_same_and_reads_on(tmp_path, monkeypatch, trace_format):
    """From PROCESS_MIN_RANKS ranks (lowered here to this run's 72) the first read is the workers' (as diag
    analyze loads): the same trace, and the server's reader then reads on from where the workers stopped, so a
    step appended after it is read once, not every rank's files again."""
    import pandas as pd

    import diag.dashboard.data as dashboard_data
    import diag.processes

    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=trace_format)
    threads, _ = load(tmp_path, cache=False)
    monkeypatch.setattr(diag.processes, "PROCESS_MIN_RANKS", 64)
    # threads earlier tests of this pytest process left running would make worker_count say 1 (no fork beside
    # other threads); LiveTrace.start forks before its own poll thread, which is what this test is about
    monkeypatch.setattr(diag.processes.threading, "active_count", lambda: 1)
    polls = []
    poll = dashboard_data.poll_in_workers
    monkeypatch.setattr(dashboard_data, "poll_in_workers", lambda *a, **k: polls.append(1) or poll(*a, **k))
    workers, published = load(tmp_path, cache=False)
    assert polls == [1] and [s.report_source for s in published] == ["preliminary", "computed", "computed"]
    mine, theirs = workers.snapshot.trace, threads.snapshot.trace
    for name in ("steps", "microbatches", "heartbeats"):
        pd.testing.assert_frame_equal(getattr(mine, name), getattr(theirs, name))
    assert mine.manifests == theirs.manifests and [str(s) for s in mine.skipped] == [str(s) for s in theirs.skipped]
    assert differences(workers.snapshot.report.to_dict(), threads.snapshot.report.to_dict()) == []
    before = len(mine.steps)
    if trace_format == 1:
        append_step(tmp_path, 5)
    else:  # a new segment, as a rank's writer adds one at its next flush (its schema, diag's marker included)
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        last = pq.read_table(tmp_path / "rank00005" / "steps.000001.parquet").slice(before // RANKS - 1)
        at = last.schema.get_field_index("step")
        last = last.set_column(at, last.schema.field(at), pc.add(last["step"], pa.scalar(1, last["step"].type)))
        pq.write_table(last, tmp_path / "rank00005" / "steps.000002.parquet")
    read = []  # rows each later poll reads: the one appended (all of them again would be deduplicated unseen)
    poll_here = workers._reader.poll
    workers._reader.poll = lambda *a, **k: read.append(len((data := poll_here(*a, **k))["steps"])) or data
    workers._next_publish_s = 0.0
    workers.refresh()
    steps = workers.snapshot.trace.steps
    assert read == [1] and len(steps) == before + 1 and steps["step"].max() == theirs.steps["step"].max() + 1
