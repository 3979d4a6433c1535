"""Values of many ranks at each step, held as a multiset that adds up: what an analysis keeps of a per-step
series over the ranks (a step's median, its spread) without keeping a table of every rank-step.

Up to EXACT_VALUES_PER_STEP ranks' values at a step they are exact, so the medians are those pandas gives of
the whole table. Beyond, a step whose values differ is held to within VALUE_RESOLUTION (relative): what is
held of a step is then bounded however many ranks there are, and its median is that close to the exact one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_VALUES_PER_STEP = 1024
VALUE_RESOLUTION = 2e-4
LOG_BUCKET = np.log1p(VALUE_RESOLUTION)


@dataclass
class StepValues:
    """A multiset of values by step: the distinct (step, value) pairs sorted, each with its count. Two add up by
    adding counts, so any split of the rows into shards adds up to the same StepValues. ``bounded`` keeps a step
    of more than EXACT_VALUES_PER_STEP values in a bounded size, to within VALUE_RESOLUTION."""

    step: np.ndarray  # int64
    value: np.ndarray  # float64, no NaN
    count: np.ndarray  # int64

    @classmethod
    def of(cls, rows: tuple[np.ndarray, np.ndarray], count: np.ndarray | None = None) -> StepValues:
        step, value = rows
        count = np.ones(len(step), dtype="int64") if count is None else count
        keep = ~np.isnan(value)
        step, value, count = step[keep], value[keep], count[keep]
        order = np.lexsort((value, step))
        step, value, count = step[order], value[order], count[order]
        if len(step):
            starts = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (value[1:] != value[:-1])])
            step, value, count = step[starts], value[starts], np.add.reduceat(count, starts)
        return cls(step, value, count)

    def __add__(self, other: StepValues) -> StepValues:
        return StepValues.of(
            (np.r_[self.step, other.step], np.r_[self.value, other.value]), np.r_[self.count, other.count]
        )

    def bounded(self) -> StepValues:
        """The steps of more than EXACT_VALUES_PER_STEP values, not all equal, with each value replaced by the
        centre of its bucket (``resolved``): at most a few thousand distinct values a step, whatever the number of
        ranks. Any order of the ranks resolves the same steps: counts add up exactly, a step whose values all
        agree agrees in every part, and resolving twice is resolving once. A gradient norm every rank shares
        after the all-reduce stays exact."""
        over = self._over()
        if not over.any():
            return self
        return StepValues.of((self.step, np.where(over, resolved(self.value), self.value)), self.count)

    def alike(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` at ``steps`` as ``bounded`` holds them here: resolved at the steps it resolves."""
        steps_over = self.step[self._over()]
        return np.where(np.isin(steps, steps_over), resolved(values), values)

    def _over(self) -> np.ndarray:
        """By pair: whether its step holds more than EXACT_VALUES_PER_STEP values, not all equal."""
        steps, totals = self.counts()
        distinct = np.diff(np.r_[self._starts(), len(self.step)])
        return np.isin(self.step, steps[(totals > EXACT_VALUES_PER_STEP) & (distinct > 1)])

    def at(self, keep: np.ndarray) -> StepValues:
        """The pairs where ``keep``, still sorted."""
        return StepValues(self.step[keep], self.value[keep], self.count[keep])

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The steps with values, and how many values each has."""
        starts = self._starts()
        return self.step[starts], np.add.reduceat(self.count, starts) if len(starts) else self.count

    def _starts(self) -> np.ndarray:
        return np.flatnonzero(np.r_[True, self.step[1:] != self.step[:-1]]) if len(self.step) else self.step

    def medians(self) -> tuple[np.ndarray, np.ndarray]:
        """The steps with values, and each step's median: its middle value, or the mean of the middle two, as
        pandas and numpy take it."""
        steps, totals = self.counts()
        if not len(steps):
            return steps, self.value
        cumulative = np.cumsum(self.count)
        starts = self._starts()
        before = cumulative[starts] - self.count[starts]  # values at earlier steps
        low = self.value[np.searchsorted(cumulative, before + (totals - 1) // 2, side="right")]
        high = self.value[np.searchsorted(cumulative, before + totals // 2, side="right")]
        return steps, np.where(totals % 2 == 1, low, (low + high) / 2)

    @property
    def nbytes(self) -> int:
        return self.step.nbytes + self.value.nbytes + self.count.nbytes


def add_values(a: StepValues | None, b: StepValues | None) -> StepValues:
    """``a + b``, bounded; either may be None."""
    return b if a is None else a if b is None else (a + b).bounded()


def resolved(values: np.ndarray) -> np.ndarray:
    """Each finite non-zero value as the centre of its logarithmic bucket, VALUE_RESOLUTION wide: within
    VALUE_RESOLUTION / 2 of it, relative. The centre of a bucket is in that bucket."""
    out = values.astype("float64", copy=True)
    finite = np.isfinite(out) & (out != 0)
    bucket = np.floor(np.log(np.abs(out[finite])) / LOG_BUCKET)
    out[finite] = np.copysign(np.exp((bucket + 0.5) * LOG_BUCKET), out[finite])
    return out
