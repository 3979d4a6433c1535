"""A straggler's cost is what the job would save if it worked like the other ranks: checked against the
slowdown real gloo DDP jobs have (step time with the planted 40 ms sleep minus step time without it, measured
by the job itself with perf_counter), for 2, 3 and 8 ranks. With 2 ranks the median of both ranks is their
average, which halved the cost before it was compared with the other ranks only."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from diag.analysis.stragglers import RankStepTimes, find_stragglers, joint_saving_us, others_median
from tests.analysis.helpers import cost_truths_s, findings_of, run_planted_job

EXTRA_MS = 40
SLOW_RANK = 1


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
def test_straggler_cost_matches_the_measured_slowdown(tmp_path, world):
    # The truth is the difference of two separate runs' step times. With more ranks than cores (8 on this
    # 2-core machine) each run's own step time moves with the scheduling, so that difference is known less
    # well: 25% holds where each rank has a core, 40% where they share (31 ms measured, 39 ms named, once).
    tolerance = 0.25 if world <= (os.cpu_count() or 1) else 0.4
    baseline_s, baseline = run_planted_job(tmp_path / "baseline", world, "none", SLOW_RANK, EXTRA_MS)
    planted_s, report = run_planted_job(tmp_path / "planted", world, "sleep", SLOW_RANK, EXTRA_MS)
    measured_s = planted_s - baseline_s
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


def _times(busy_us: dict[int, list[float]]) -> RankStepTimes:
    rows = [
        {"rank": r, "step": i, "data_wait_us": 0.0, "compute_us": b, "wait_us": 0.0, "busy_us": b, "peers": 0}
        for r, values in busy_us.items()
        for i, b in enumerate(values)
    ]
    frame = pd.DataFrame(rows)
    frame["duration_us"] = frame["iteration_us"] = frame["busy_us"]
    return RankStepTimes(frame, "steps.comm_wait_us")


def test_two_rank_straggler_is_compared_with_the_other_rank_not_the_average():
    times = _times({0: [100.0] * 10, 1: [140.0] * 10})
    report = find_stragglers(times, pd.DataFrame(), {}, {})
    (straggler,) = report.stragglers
    assert straggler.rank == 1 and straggler.persistent
    assert straggler.slowdown == pytest.approx(0.4)
    assert straggler.time_saved_per_step_s == pytest.approx(40e-6)
    assert straggler.excess_compute_ms == pytest.approx(0.04)
    assert joint_saving_us(times, [1]) == pytest.approx(400.0)


def test_a_two_rank_job_with_a_15_percent_straggler_is_not_missed():
    """Against the average of two ranks a 15% slower rank looked 7% slower: under the 10% threshold."""
    times = _times({0: [100.0] * 10, 1: [115.0] * 10})
    (straggler,) = find_stragglers(times, pd.DataFrame(), {}, {}).stragglers
    assert straggler.persistent and straggler.slowdown == pytest.approx(0.15)


def test_cost_stops_at_the_next_busiest_rank():
    """Fixing the worst of two stragglers saves only down to the second; fixing both, down to the others."""
    times = _times({0: [100.0] * 4, 1: [100.0] * 4, 2: [130.0] * 4, 3: [150.0] * 4})
    report = find_stragglers(times, pd.DataFrame(), {}, {})
    saved = {s.rank: s.time_saved_per_step_s for s in report.stragglers}
    assert saved == {3: pytest.approx(20e-6), 2: pytest.approx(0.0)}
    assert joint_saving_us(times, [2, 3]) == pytest.approx(4 * 50.0)


def test_others_median_leaves_each_element_out_of_its_own_cell():
    values = np.array([100.0, 140.0, 1.0, 2.0, 3.0, 5.0, 4.0, 4.0, 9.0, 1.0])
    cells = np.array([0, 0, 1, 1, 1, 2, 3, 3, 3, 3])
    expected = [140.0, 100.0, 2.5, 2.0, 1.5, np.nan, 4.0, 4.0, 4.0, 4.0]
    np.testing.assert_array_equal(others_median(values, cells), expected)


def test_others_median_of_equal_cells_is_the_brute_force_one():
    """Every rank in every step (cells of equal size, the matrix fast path) with ties: each element gets the
    median of its cell without it, computed one by one."""
    rng = np.random.default_rng(5)
    ranks, steps = 9, 13
    values = rng.integers(0, 6, ranks * steps).astype("float64")  # few distinct values: many ties
    cells = np.tile(np.arange(steps), ranks)  # the (rank, step) frame's order
    index = np.arange(len(values))
    expected = [np.median(values[(cells == c) & (index != i)]) for i, c in enumerate(cells)]
    np.testing.assert_array_equal(others_median(values, cells), expected)
