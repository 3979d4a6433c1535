"""A straggler's cost is what the job would save if it worked like the other ranks: checked against the
slowdown real gloo DDP jobs have (step time with the planted 40 ms sleep minus step time without it, measured
by the job itself with perf_counter), for 2, 3 and 8 ranks. With 2 ranks the median of both ranks is their
average, which halved the cost before it was compared with the other ranks only."""

from __future__ import annotations

import os

import pytest

from tests.analysis.helpers import cost_truths_s, findings_of, run_planted_job

EXTRA_MS = 40
SLOW_RANK = 1


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
def test_straggler_cost_matches_the_measured_slowdown(tmp_path, world):
    # The truth is the difference of two separate runs' step times. Where each rank has a core, the sleep is
    # on the job's critical path and that difference is known within 25%. With more ranks than cores (8 on
    # this 2-core machine) the sleeping rank hands its core to the others, so a loaded host absorbs part of the
    # sleep: with 6 busy loops beside it the same job measured 8.5 and 28.7 ms in two pairs of runs while diag
    # named 37.1 and 38.3 ms. There the estimate is held to the plant (what fixing the rank saves where ranks do
    # not share cores, as on GPU hosts) or the measured difference, within 40%.
    shares_cores = world > (os.cpu_count() or 1)
    tolerance = 0.4 if shares_cores else 0.25
    baseline_s, baseline = run_planted_job(tmp_path / "baseline", world, "none", SLOW_RANK, EXTRA_MS)
    planted_s, report = run_planted_job(tmp_path / "planted", world, "sleep", SLOW_RANK, EXTRA_MS)
    measured_s = planted_s - baseline_s
    if not shares_cores:
        assert measured_s > 0.5 * EXTRA_MS / 1e3, (planted_s, baseline_s)  # the sleep did slow the job down

    persistent = [s for s in report["stragglers"] if s["persistent"]]
    assert [(s["rank"], s["cause"]) for s in persistent] == [(SLOW_RANK, "compute")]
    truths_s = cost_truths_s(measured_s, EXTRA_MS / 1e3)
    assert any(persistent[0]["time_saved_per_step_s"] == pytest.approx(t, rel=tolerance) for t in truths_s)
    finding = findings_of(report, "straggler")[0]
    assert finding["ranks"] == [SLOW_RANK]
    assert finding["time_lost_per_step_s"] == pytest.approx(persistent[0]["time_saved_per_step_s"])
    # its slowdown is its work against the others' (10 ms of sleep + a tiny model), not against the average
    assert persistent[0]["slowdown"] > 2.0
    assert not findings_of(baseline, "straggler") and not [s for s in baseline["stragglers"] if s["persistent"]]
