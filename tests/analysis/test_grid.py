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
        g = g.assign(slow=g["busy_us"] > 100, spike=g["busy_us"] > 107)
        expected = g.groupby("rank").agg(
            busy_median_us=("busy_us", "median"),
            slow_fraction=("slow", "mean"),
            slow_steps=("slow", "sum"),
            spikes=("spike", "sum"),
            peers=("peers", "first"),
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
