"""diag.analysis.grid's matrix reductions give the groupbys they replace, Series for Series (values bit for bit,
index, dtype, name), on the usual rank-major frame (steps in any order, ties, int32 and float64 columns) and on
the frames that must go through the groupby (shuffled rows, a rank short of a step, NaN); and the straggler
analysis's per-rank frame likewise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.analysis import grid
from diag.analysis.stragglers import _per_rank


def frame(steps: np.ndarray, ranks: np.ndarray, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = len(steps) * len(ranks)
    return pd.DataFrame(
        {
            "rank": np.repeat(ranks, len(steps)).astype("int32"),
            "step": np.tile(steps, len(ranks)).astype("int32"),
            "busy_us": rng.integers(90, 110, size=n).astype("float64"),  # many ties
            "wait_us": rng.normal(1e3, 50, size=n),
            "data_wait_us": rng.integers(0, 2000, size=n).astype("int32"),
            "peers": np.zeros(n, dtype="int64"),
        }
    )


USUAL = [
    frame(np.arange(3, 43), np.array([0, 1, 2, 3, 4, 5])),  # an even count of ranks: medians of two values
    frame(np.array([9, 2, 5, 1]), np.array([7, 3, 11, 4, 5])),  # steps and ranks out of order, odd count
]


def others(f: pd.DataFrame) -> list[pd.DataFrame]:
    nan = f.copy()
    nan.loc[5, "busy_us"] = np.nan
    return [f.sample(frac=1.0, random_state=2), f.iloc[:-1], nan]


@pytest.mark.parametrize("f", USUAL)
@pytest.mark.parametrize("column", ["busy_us", "wait_us", "data_wait_us"])
def test_per_step_and_per_rank_equal_the_groupby(f, column):
    for g in [f, *others(f)]:
        for how in ("median", "max"):
            expected_step = getattr(g.groupby("step")[column], how)()
            pd.testing.assert_series_equal(grid.per_step(g, column, how), expected_step, check_exact=True)
            expected_rank = getattr(g.groupby("rank")[column], how)()
            pd.testing.assert_series_equal(grid.per_rank(g, column, how), expected_rank, check_exact=True)
    assert grid.rank_major(f["rank"].to_numpy(), f["step"].to_numpy()) is not None
    assert all(grid.rank_major(g["rank"].to_numpy(), g["step"].to_numpy()) is None for g in others(f)[:2])


@pytest.mark.parametrize("f", USUAL)
def test_rank_of_step_max_equals_idxmax(f):
    for g in [f, *others(f)]:
        expected = g.loc[g.groupby("step")["busy_us"].idxmax(), ["step", "rank"]].set_index("step")["rank"]
        pd.testing.assert_series_equal(grid.rank_of_step_max(g, "busy_us"), expected, check_exact=True)


@pytest.mark.parametrize("f", USUAL)
def test_stragglers_per_rank_frame_equals_the_groupby(f):
    for g in [f, *others(f)[:2]]:
        excess = (g["busy_us"] - 100) / 100
        g = g.assign(slow=g["busy_us"] > 100, spike=g["busy_us"] > 107, excess_fraction=excess.where(excess > -0.5))
        expected = g.groupby("rank").agg(
            busy_median_us=("busy_us", "median"),
            slow_fraction=("slow", "mean"),
            slow_steps=("slow", "sum"),
            spikes=("spike", "sum"),
            peers=("peers", "first"),
            steps=("excess_fraction", "count"),
        )
        pd.testing.assert_frame_equal(_per_rank(g), expected, check_exact=True)


def test_choose_window_from_the_layout_equals_the_groupby():
    """choose_window on the usual steps table (every rank the same steps: no groupby) and on the same rows
    shuffled (the groupby path): the same window, warm-up found in both; a rank short of steps is noticed."""
    from diag.analysis.window import choose_window

    steps = np.arange(10, 40)
    f = frame(steps, np.array([0, 1, 2, 3, 4])).rename(columns={"wait_us": "duration_us"})
    f["duration_us"] = 1e5 + f["busy_us"]
    f.loc[f["step"] < 12, "duration_us"] *= 3  # two warm-up steps
    for step_range, failed in ((None, None), ((15, 30), None), (None, [20])):
        usual = choose_window(f, step_range, failed)
        shuffled = choose_window(f.sample(frac=1.0, random_state=3), step_range, failed)
        assert {k: v for k, v in vars(usual).items() if k != "step_indices"} == {
            k: v for k, v in vars(shuffled).items() if k != "step_indices"
        }
        np.testing.assert_array_equal(usual.step_indices, shuffled.step_indices)
    assert choose_window(f).warmup_steps_excluded == [10, 11]
    short = choose_window(f.iloc[:-1])
    assert short.ranks_short == [4] and short.incomplete_steps_excluded == [39]


def test_telemetry_bounds_in_window_equal_those_of_the_selected_steps():
    """The ranks' telemetry windows from the matrices equal telemetry_bounds of the window's rows, with holes in
    the window, for an empty window, and through select where the layout is not the usual one."""
    from diag.analysis.report import telemetry_bounds, telemetry_bounds_in_window
    from diag.analysis.window import StepWindow, select

    steps = np.arange(0, 30)
    f = frame(steps, np.array([3, 1, 2, 0]))
    f["start_us"] = (1_700_000_000_000_000 + f["step"].astype("int64") * 1000 + f["rank"] * 7).astype("int64")
    f["duration_us"] = f["data_wait_us"]
    holes = StepWindow(5, 20, 14, 30, step_indices=np.array([s for s in range(5, 21) if s not in (9, 12)]))
    windows = [StepWindow(2, 27, 26, 30), holes, StepWindow(None, None, 0, 30)]
    for g in (f, f.sample(frac=1.0, random_state=4)):
        for window in windows:
            steps_w = select(g, window)
            expected = telemetry_bounds(steps_w) if len(steps_w) else None
            got = telemetry_bounds_in_window(g, window)
            if expected is None:
                assert got is None
            else:
                pd.testing.assert_frame_equal(got, expected, check_exact=True)


@pytest.mark.parametrize("f", USUAL)
def test_find_stragglers_same_report_on_the_usual_layout_and_shuffled(f):
    """find_stragglers (and its per-step medians and maxima for the joint saving) on the usual layout and on the
    same rows shuffled (every groupby path): the same report, the same Series."""
    from diag.analysis.stragglers import RankStepTimes, _by_peers_step, find_stragglers, joint_saving_us

    f = f.assign(compute_us=f["busy_us"] - 10.0, iteration_us=f["busy_us"] + 5.0)
    f.loc[f["rank"] == f["rank"].iloc[0], "busy_us"] += 30.0  # a straggler
    reports, savings = [], []
    for g in (f, f.sample(frac=1.0, random_state=5).reset_index(drop=True)):
        for how in ("median", "max"):
            expected = getattr(g.groupby(["peers", "step"])["busy_us"], how)()
            pd.testing.assert_series_equal(_by_peers_step(g, how), expected, check_exact=True)
        times = RankStepTimes(g, "steps.comm_wait_us")
        reports.append(find_stragglers(times, pd.DataFrame(), {}, {}))
        savings.append(joint_saving_us(times, [int(f["rank"].iloc[0])]))
    assert reports[0] == reports[1] and reports[0].stragglers
    assert savings[0] == savings[1] > 0
