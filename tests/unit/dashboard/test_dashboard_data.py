"""The dashboard's data and figures without a browser: bounded figure sizes, rank states, incremental reads,
lazy imports, and pages that fail without breaking."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from plotly.io.json import to_json_plotly

from diag.dashboard import data as d
from diag.dashboard import figures as f
from diag.trace.schema import STEPS
from diag.trace.writer import RankWriter
from tests.conftest import REPO

FIGURE_LIMIT_BYTES = 2 * 2**20


def _big_times(ranks: int = 1024, steps: int = 1000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rank, step = np.meshgrid(np.arange(ranks), np.arange(steps), indexing="ij")
    compute = rng.lognormal(11.5, 0.02, size=(ranks, steps))
    compute[384] *= 1.4
    return pd.DataFrame({"rank": rank.ravel(), "step": step.ravel(), "compute_us": compute.ravel()})


def test_heatmap_of_1024_ranks_by_1000_steps_stays_under_2_mb_and_keeps_the_straggler():
    times = _big_times()
    matrix = d.rank_step_matrix(times, "compute_us")
    assert matrix.values.shape == (256, 250)
    fig = f.heatmap_figure(matrix, "compute", [], selected_rank=384)
    assert len(to_json_plotly(fig)) < FIGURE_LIMIT_BYTES  # what Dash sends
    assert fig["data"][0]["customdata"][0][0] in range(0, 4)
    hottest_row = int(np.nanargmax(np.nanmean(matrix.values, axis=1)))
    assert matrix.row_first_rank[hottest_row] <= 384 <= matrix.row_last_rank[hottest_row]
    assert set(matrix.argmax_rank[hottest_row]) == {384}  # a click on that row selects the straggler


def test_fleet_band_bounds_points_and_keeps_extremes():
    frame = pd.DataFrame({"step": np.repeat(np.arange(1000), 1024), "v": np.arange(1024 * 1000, dtype="float64")})
    band = d.fleet_band(frame, "step", "v", max_points=500)
    assert len(band) == 500
    assert band["min"].min() == 0 and band["max"].max() == 1024 * 1000 - 1


def _manifest(rank: int, finished: bool) -> dict:
    return {
        "schema_version": 1,
        "run_id": "r",
        "rank": rank,
        "world_size": 3,
        "clock_offset_us": 0,
        "finished": finished,
    }


def _steps(writer: RankWriter, steps: range, step_s: float) -> None:
    for s in steps:
        start_us = 1_795_000_000_000_000 + int(s * step_s * 1e6)
        times = {"data_wait_us": 10, "forward_us": 300, "backward_us": 500, "optimizer_us": 100, "comm_wait_us": 50}
        writer.append("steps", STEPS.row(step=s, start_us=start_us, duration_us=1000, samples=8, **times))
    writer.flush()


def test_poll_reads_only_appended_rows_and_marks_a_rank_that_stopped_stale(tmp_path):
    writers = {r: RankWriter(tmp_path / f"rank{r:05d}") for r in range(3)}
    for r, w in writers.items():
        w.write_manifest(_manifest(r, False))
        _steps(w, range(3), 1.0)
    live = d.LiveTrace(tmp_path, stale_after_s=10, triage=False)
    assert live.refresh()
    assert len(live.snapshot.trace.steps) == 9
    assert set(live.snapshot.rank_states["state"]) == {d.LIVE}
    assert not live.refresh()  # nothing appended: no new snapshot of the data
    for r in (0, 1):
        _steps(writers[r], range(3, 6), 20.0)
    live._next_publish_s = 0.0  # on a loaded machine the first analysis can pass 1 s and hold this one back
    assert live.refresh()
    steps = live.snapshot.trace.steps
    assert len(steps) == 15 and not steps.duplicated(["rank", "step"]).any()
    states = live.snapshot.rank_states.set_index("rank")["state"]
    assert states.to_dict() == {0: d.LIVE, 1: d.LIVE, 2: d.STALE}
    for r, w in writers.items():
        w.write_manifest(_manifest(r, True))
    live._next_publish_s = 0.0  # as above: the analysis just published may have taken over 1 s
    live.refresh()
    assert live.snapshot.run_state == "finished"


def test_missing_directory_is_an_error_snapshot_not_an_exception(tmp_path):
    live = d.LiveTrace(tmp_path / "nope", triage=False)
    live.refresh()
    assert "does not exist" in live.snapshot.error


def test_a_page_that_raises_says_so_instead_of_breaking():
    pytest.importorskip("dash")
    from diag.dashboard.app import render_page
    from diag.dashboard.pages import Page

    def broken(snap, rank):
        raise KeyError("steps")

    page = Page("/x", "X", ("a",), ("t",), broken)
    content = render_page(page, d.Snapshot(version=1, trace_dir=None), None)
    assert "could not be drawn" in str(content["t"].children)  # said once, in the page's text
    assert "could not be drawn" not in json.dumps(content["a"].to_plotly_json()["layout"])


def test_rank_from_click_reads_customdata():
    from diag.dashboard.app import rank_from_click

    assert rank_from_click({"points": [{"customdata": 7}]}) == 7
    assert rank_from_click({"points": [{"customdata": [5]}]}) == 5
    assert rank_from_click({"points": [{"x": 3}]}) is None
    assert rank_from_click({"points": [{"customdata": -1}]}) is None  # an empty heatmap cell


def test_binding_beyond_loopback_is_detected():
    from diag.commands.dashboard import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_manifests_with_different_keys_and_fresh_heartbeats_are_not_new_data(tmp_path):
    """Otherwise every poll would re-run the whole analysis of a large run that is not writing anything."""
    for r in range(2):
        w = RankWriter(tmp_path / f"rank{r:05d}")
        w.write_manifest({**_manifest(r, False), **({"pipeline": None, "extra": 1} if r else {})})
        _steps(w, range(3), 1.0)
        w.write_heartbeat({"rank": r, "time_us": 1_795_000_010_000_000, "state": "running"})
    live = d.LiveTrace(tmp_path, triage=False)
    assert live.refresh()
    for r in range(2):
        RankWriter(tmp_path / f"rank{r:05d}").write_heartbeat(
            {"rank": r, "time_us": 1_795_000_020_000_000, "state": "running"}
        )
    assert not live.refresh()


def test_a_run_that_has_not_started_yet_is_picked_up_when_it_writes(tmp_path):
    live = d.LiveTrace(tmp_path, triage=False)
    live.refresh()
    assert "no diag traces" in live.snapshot.error
    w = RankWriter(tmp_path / "rank00000")
    w.write_manifest(_manifest(0, False))
    _steps(w, range(2), 1.0)
    assert live.refresh()
    assert live.snapshot.error is None and len(live.snapshot.trace.steps) == 2


def test_pipeline_page_draws_the_reports_bubble_and_timeline():
    """The page shows what the Report says (a changed Report changes the page) and computes nothing itself:
    without a Report it says why instead of running the bubble analysis."""
    pytest.importorskip("dash")
    import dataclasses

    from diag.dashboard.pages import update_pipeline

    run = Path(__file__).resolve().parents[3] / "sample_traces" / "pipeline"  # 4-rank 1F1B, stage 2 slow
    live = d.LiveTrace(run, triage=False)
    live.refresh()
    snap = live.snapshot
    out = update_pipeline(snap, None)
    assert "Slowest stage 2:" in str(out["body"])
    rows = snap.report.pipeline_timeline
    first_rank = {stage: min(r["rank"] for r in rows if r["stage"] == stage) for stage in {r["stage"] for r in rows}}
    gantt_bars = sum(len(t.x) for t in out["gantt"].data if t.name != "idle")
    assert gantt_bars == sum(1 for r in rows if r["rank"] == first_rank[r["stage"]]) > 0  # one rank per stage

    report = snap.report
    edited = dataclasses.replace(
        report,
        bubble=dataclasses.replace(report.bubble, slowest_stage=3, measured_fraction=0.5),
        pipeline_timeline=[r for r in report.pipeline_timeline if r["action"] == "forward"],
    )
    out = update_pipeline(dataclasses.replace(snap, report=edited, _memo={}), None)
    assert "Slowest stage 3:" in str(out["body"]) and "Bubble: 50% of the step measured" in str(out["body"])
    assert {t.name for t in out["gantt"].data} == {"idle", "forward"}

    no_report = dataclasses.replace(snap, report=None, analysis_error="no steps recorded yet", _memo={})
    out = update_pipeline(no_report, None)
    assert "Cannot draw this page: no steps recorded yet" in str(out["body"])


def test_a_poll_that_fails_while_the_process_exits_says_nothing(monkeypatch, capsys):
    """At exit the thread pools a poll reads with refuse work, with an error that does not always name the
    interpreter's shutdown. The exit itself cannot be staged in the test's process, so the main thread's end is
    patched in here; a real ``diag dashboard`` stopped by Ctrl-C while it polls is
    tests/integration/dashboard/test_server_log.py's."""
    live = d.LiveTrace(REPO / "sample_traces" / "straggler", triage=False)
    live.refresh()

    def refused():
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(live, "_refresh", refused)
    monkeypatch.setattr(d, "process_exiting", lambda: True)
    assert live.refresh() is False and not live._refresh_quietly()
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(d, "process_exiting", lambda: False)  # the same failure while the process runs is said
    assert live.refresh() is False and live._refresh_quietly()
    assert "could not read" in capsys.readouterr().err
    assert live.snapshot.trace is not None  # the last data read is still shown


def test_the_exit_is_seen_from_the_start_of_threadings_shutdown(monkeypatch):
    """threading's shutdown runs the thread pools' exit hooks (after which they refuse work) before it stops the
    main thread: the exit is seen from there, as the flag that shutdown sets first says."""
    import threading

    assert not d.process_exiting()
    monkeypatch.setattr(threading, "_SHUTTING_DOWN", True, raising=False)
    assert threading.main_thread().is_alive() and d.process_exiting()
