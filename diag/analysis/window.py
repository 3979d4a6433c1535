"""Which steps to analyse: steps every rank finished, without the warm-up (or the user's ``--steps A:B``).

A step only some ranks recorded is one still being written or one a rank never reached (crash, hang); its
timings are not comparable across ranks, so it is left out and listed. So is a step in which a rank raised:
its time is how long the rank took to fail. Warm-up steps (compilation, allocator
growth, NCCL communicator setup) are slower than the steady state and would bias every average.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis import grid

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("data_wait_us", "duration_us")}

WARMUP_SLOW_FACTOR = 1.5  # a leading step this much slower than the steady median is warm-up
WARMUP_MAX_FRACTION = 0.2  # never call more than this share of the steps warm-up


@dataclass
class StepWindow:
    first_step: int | None  # first step analysed (inclusive)
    last_step: int | None  # last step analysed (inclusive)
    steps_analysed: int
    steps_recorded: int  # distinct step indices seen on any rank
    warmup_steps_excluded: list[int] = field(default_factory=list)
    incomplete_steps_excluded: list[int] = field(default_factory=list)  # steps some ranks never finished
    failed_steps_excluded: list[int] = field(default_factory=list)  # steps in which a rank raised
    ranks_short: list[int] = field(default_factory=list)  # ranks that lack some of the recorded steps
    user_range: str | None = None  # "A:B" when the user chose the window
    notes: list[str] = field(default_factory=list)
    step_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="int64"), repr=False)  # not in JSON


def parse_step_range(text: str | None) -> tuple[int | None, int | None] | None:
    """``"A:B"`` -> (A, B), B exclusive like a Python slice; either side may be empty."""
    if text is None:
        return None
    if ":" not in text:
        raise ValueError(f"--steps wants A:B (e.g. 100:200), got {text!r}")
    start, _, stop = text.partition(":")
    try:
        return (int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError as exc:
        raise ValueError(f"--steps wants integers A:B (e.g. 100:200), got {text!r}") from exc


def iteration_us(steps: pd.DataFrame) -> pd.Series:
    """A rank's share of one iteration: waiting for its batch, then the step body."""
    return steps["data_wait_us"].astype("int64") + steps["duration_us"].astype("int64")


def choose_window(
    steps: pd.DataFrame,
    step_range: tuple[int | None, int | None] | None = None,
    failed_steps: list[int] | None = None,
) -> StepWindow:
    if steps.empty:
        return StepWindow(None, None, 0, 0, notes=["no steps recorded"])
    layout = grid.rank_major(steps["rank"].to_numpy(), steps["step"].to_numpy())
    if layout is not None:  # every rank recorded the same steps: each step has every rank (no 16 M-row groupby)
        n_ranks, recorded = layout[0], np.sort(layout[1])
        ranks_per_step = pd.Series(np.full(len(recorded), n_ranks), index=pd.Index(recorded, name="step"))
    else:
        ranks_per_step = steps.groupby("step", sort=True)["rank"].nunique()
        n_ranks = steps["rank"].nunique()
    complete = ranks_per_step.index[ranks_per_step.to_numpy() == n_ranks].to_numpy()
    failed = np.intersect1d(ranks_per_step.index.to_numpy(), np.asarray(failed_steps or [], dtype="int64"))
    complete = np.setdiff1d(complete, failed)
    incomplete = ranks_per_step.index[ranks_per_step.to_numpy() < n_ranks].to_numpy()
    window = StepWindow(None, None, 0, len(ranks_per_step), incomplete_steps_excluded=_short_list(incomplete))
    if len(incomplete):
        rank_steps = steps.groupby("rank")["step"].nunique()
        window.ranks_short = sorted(int(r) for r in rank_steps.index[rank_steps.to_numpy() < len(ranks_per_step)])
        window.notes.append(
            f"{len(incomplete)} steps not finished by every rank were left out "
            f"(ranks {_short_text(window.ranks_short)} lack some)"
        )
    if len(failed):
        window.failed_steps_excluded = _short_list(failed)
        window.notes.append(
            f"{len(failed)} steps in which a rank raised were left out (steps {_short_text(window.failed_steps_excluded)})"
        )
    if step_range is not None:
        start, stop = step_range
        keep = np.ones(len(complete), dtype=bool)
        if start is not None:
            keep &= complete >= start
        if stop is not None:
            keep &= complete < stop
        chosen = complete[keep]
        window.user_range = f"{'' if start is None else start}:{'' if stop is None else stop}"
        if not len(chosen):
            window.notes.append(f"no complete step in --steps {window.user_range}")
    else:
        every = layout is not None and len(complete) == len(ranks_per_step)  # no copy of the frame to keep it all
        warmup = _warmup_steps(steps if every else steps[steps["step"].isin(complete)], complete)
        window.warmup_steps_excluded = [int(s) for s in warmup]
        if warmup:
            which = f"step {warmup[0]}" if len(warmup) == 1 else f"steps {warmup[0]}..{warmup[-1]}"
            window.notes.append(f"warm-up {which} left out (use --steps to choose)")
        chosen = complete[len(warmup) :]
    window.step_indices = np.asarray(chosen, dtype="int64")
    if len(chosen):
        window.first_step, window.last_step, window.steps_analysed = int(chosen[0]), int(chosen[-1]), len(chosen)
    return window


def select(steps: pd.DataFrame, window: StepWindow, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Rows of the steps in the window (complete steps between first and last, warm-up already outside);
    ``columns``: only those of them the table has, and its rank and step: a copy of the columns an analysis
    reads, not of every column."""
    rows = in_window(steps["step"], window)
    if columns is None:
        return steps[rows]
    return steps.loc[rows, [c for c in steps.columns if c in ("rank", "step", *columns)]]


def in_window(step: pd.Series, window: StepWindow) -> pd.Series:
    """Mask of rows of any table (collectives, memory, ...) whose step lies in the window."""
    if window.first_step is None:
        return pd.Series(False, index=step.index)
    mask = step.between(window.first_step, window.last_step)
    if window.steps_analysed < window.last_step - window.first_step + 1:  # holes: incomplete steps inside
        mask &= step.isin(window.step_indices)
    return mask


def in_window_array(step: np.ndarray, window: StepWindow) -> np.ndarray:
    """``in_window`` on a numpy array of steps: the per-rank reductions call it thousands of times, where
    building a Series for each (~0.6 ms) was a tenth of reading a rank's collectives."""
    if window.first_step is None:
        return np.zeros(len(step), dtype=bool)
    mask = (step >= window.first_step) & (step <= window.last_step)
    if window.steps_analysed < window.last_step - window.first_step + 1:  # holes: incomplete steps inside
        mask &= np.isin(step, window.step_indices)
    return mask


def _warmup_steps(steps: pd.DataFrame, complete: np.ndarray) -> list[int]:
    if len(complete) < 4:
        return []
    iterations = pd.DataFrame({"rank": steps["rank"], "step": steps["step"], "iteration_us": iteration_us(steps)})
    per_step = grid.per_step(iterations, "iteration_us")
    per_step = per_step.reindex(complete).to_numpy()  # iteration_us(steps).groupby(steps["step"]).median()
    steady = np.median(per_step[len(per_step) // 2 :])
    cap = max(1, int(len(complete) * WARMUP_MAX_FRACTION))
    n = 1  # the first step always pays for compilation, allocation and communicator setup
    while n < cap and per_step[n] > WARMUP_SLOW_FACTOR * steady:
        n += 1
    return [int(s) for s in complete[:n]]


def _short_list(values: np.ndarray, limit: int = 1000) -> list[int]:
    return [int(v) for v in values[:limit]]


def _short_text(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
