"""Values of many ranks at each step as a multiset that adds up (diag.analysis.step_values): any split of the rows
adds up to the same values, whose per-step medians are those pandas gives of the whole table; a value held to
the resolution is within it, and holding it twice is holding it once."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.analysis.step_values import VALUE_RESOLUTION, StepValues, add_values, resolved


def test_any_split_of_the_rows_adds_up_to_the_medians_of_the_whole_table():
    rng = np.random.default_rng(3)
    step = rng.integers(0, 40, 5_000)
    value = np.round(rng.normal(2.0, 0.3, 5_000), 2)  # repeated values: counts above one
    value[rng.random(5_000) < 0.05] = np.nan
    expected = pd.Series(value).groupby(step).median().dropna()
    cuts = np.sort(rng.choice(np.arange(1, 5_000), 7, replace=False))
    parts = [StepValues.of((s, v)) for s, v in zip(np.split(step, cuts), np.split(value, cuts), strict=True)]
    total = parts[0]
    for part in parts[1:][::-1]:
        total = add_values(total, part)
    steps, medians = total.medians()
    assert steps.tolist() == expected.index.tolist()
    assert medians.tolist() == expected.tolist()  # exact: the same middle values, the same mean of two


def test_a_value_held_to_the_resolution_is_within_it_and_stays_put():
    values = np.r_[np.random.default_rng(0).lognormal(0, 3, 10_000), -2.5, 0.0, np.inf, -np.inf]
    once = resolved(values)
    finite = np.isfinite(values) & (values != 0)
    assert np.all(np.abs(once[finite] / values[finite] - 1) <= VALUE_RESOLUTION / 2 * 1.0001)
    assert np.array_equal(resolved(once), once)  # resolving twice is resolving once
    assert np.array_equal(once[~finite], values[~finite])
