"""A straggler's cost is what the job would save if it worked like the other ranks: checked against the
slowdown real gloo DDP jobs have (step time with the planted 40 ms sleep minus step time without it, measured
by the job itself with perf_counter), for 2, 3 and 8 ranks. With 2 ranks the median of both ranks is their
average, which halved the cost before it was compared with the other ranks only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.analysis.stragglers import RankStepTimes, find_stragglers, joint_saving_us, others_median


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
