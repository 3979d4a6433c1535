"""The large-trace paths of the straggler analysis against the general ones they replace above 65,536
rank-steps (the sizes where the general ones cost seconds: docs/scale.md): the same results on frames with ties,
pipeline stages (several peers groups) and, for the joint saving, NaN busy times. The fast paths are called
directly on small frames, where the analysis itself would take the general path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.analysis.stragglers import (
    RankStepTimes,
    _others_max,
    _regular_rows,
    _saved_per_rank_step,
    _saved_per_rank_step_by_cell,
    cell_rows,
    others_median,
    step_cells,
)
from diag.analysis.window import StepWindow, in_window, in_window_array


def frame(seed: int, ranks: int = 12, steps: int = 40, stages: int = 1, nan_share: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    busy = rng.integers(90, 110, size=len(rank)).astype("float64")  # integers: many ties within a step
    busy[rank == 3] += 25  # one slow rank
    busy[rng.random(len(busy)) < nan_share] = np.nan
    f = pd.DataFrame({"rank": rank, "step": step, "busy_us": busy, "peers": rank % stages})
    return f.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # rows in no particular order


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stages", [1, 3])
def test_saving_per_rank_step_by_cell_equals_the_sorted_one(seed, stages):
    f = frame(seed, stages=stages)
    expected = _saved_per_rank_step(f)  # small frame: the lexsort path
    got = _saved_per_rank_step_by_cell(f)
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
    assert expected.max() > 0  # the slow rank saves something: the comparison is not of zeros


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("nan_share", [0.0, 0.05])
def test_others_max_equals_the_groupby(seed, nan_share):
    f = frame(seed, stages=2, nan_share=nan_share)
    times = RankStepTimes(frame=f, wait_source="none")
    times.step_max_busy_us = f.groupby(["peers", "step"])["busy_us"].max()
    for ranks in ([3], [0, 3, 5], list(range(12))):
        expected = f[~f["rank"].isin(ranks)].groupby(["peers", "step"])["busy_us"].max()
        expected = expected.reindex(times.step_max_busy_us.index)
        pd.testing.assert_series_equal(_others_max(times, ranks), expected, check_names=False)


@pytest.mark.parametrize(
    "window",
    [
        StepWindow(first_step=5, last_step=30, steps_analysed=26, steps_recorded=40),
        StepWindow(
            first_step=5,
            last_step=30,
            steps_analysed=24,
            steps_recorded=40,
            step_indices=np.array([s for s in range(5, 31) if s not in (9, 17)]),
        ),  # fmt: skip
        StepWindow(first_step=None, last_step=None, steps_analysed=0, steps_recorded=0),
    ],
)
def test_in_window_array_equals_in_window(window):
    steps = pd.Series(np.random.default_rng(0).integers(0, 40, size=500))
    np.testing.assert_array_equal(in_window_array(steps.to_numpy(), window), in_window(steps, window).to_numpy())


def _others_median_by_sorting(values: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The definition: each element's cell sorted without it (NaN last, as np.sort), its two middle values
    averaged; NaN alone in its cell."""
    out = np.empty(len(values))
    for i in range(len(values)):
        others = np.sort(np.delete(values[cells == cells[i]], np.flatnonzero(np.flatnonzero(cells == cells[i]) == i)))
        n = len(others)
        out[i] = (others[(n - 1) // 2] + others[n // 2]) / 2 if n else np.nan
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("width", [1, 2, 3, 8, 11])
@pytest.mark.parametrize("nan_share", [0.0, 0.1])
def test_others_median_equals_sorting_each_cell(seed, width, nan_share):
    """The order-statistics path (every cell as large: cell_rows) and the sorting path (cells of several sizes)
    give, bit for bit, each element's cell sorted without it, with ties and NaN."""
    rng = np.random.default_rng(seed)
    cells = np.repeat(np.arange(7), width)
    rng.shuffle(cells)
    values = rng.integers(0, 5, size=len(cells)).astype("float64")  # many ties
    values[rng.random(len(values)) < nan_share] = np.nan
    assert cell_rows(cells) is not None
    np.testing.assert_array_equal(others_median(values, cells), _others_median_by_sorting(values, cells))
    uneven = np.r_[cells, np.full(3, 2)]  # cell 2 larger: the sorting path
    more = np.r_[values, rng.integers(0, 5, size=3).astype("float64")]
    assert cell_rows(uneven) is None
    np.testing.assert_array_equal(others_median(more, uneven), _others_median_by_sorting(more, uneven))


@pytest.mark.parametrize("steps", [np.arange(5, 45), np.array([7, 3, 9, 1, 4])])
def test_step_cells_from_the_layout_equal_the_groupby(steps):
    """The usual layout (rank by rank, the same steps on every rank, in any order) numbered as the groupby numbers
    it, sorted or by first appearance; frames out of that layout (shuffled, stages, a rank short of a step) go
    through the groupby itself."""
    ranks = np.array([4, 0, 9, 2])
    f = pd.DataFrame({"rank": np.repeat(ranks, len(steps)), "step": np.tile(steps, len(ranks)), "peers": 0})
    for sort in (False, True):
        np.testing.assert_array_equal(step_cells(f, sort), f.groupby(["peers", "step"], sort=sort).ngroup())
    np.testing.assert_array_equal(_regular_rows(f), cell_rows(step_cells(f, False)))
    others = [f.sample(frac=1.0, random_state=1), f.assign(peers=f["rank"] % 2), f.iloc[:-1]]
    for g in others:
        assert _regular_rows(g) is None
        for sort in (False, True):
            np.testing.assert_array_equal(step_cells(g, sort), g.groupby(["peers", "step"], sort=sort).ngroup())
