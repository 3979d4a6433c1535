"""Per-step and per-rank reductions of a rank-step frame (the steps table, ``RankStepTimes.frame``) without
grouping its rows, where the frame is the usual one: rank by rank, every rank the same distinct steps in the same
order. Such a frame's column is a ranks x steps matrix as it is (a reshape, no copy), and a step's median over
the ranks is a column's: ``np.median`` selects the middle values instead of pandas grouping and sorting 16 M
rows (~0.3-0.6 s a reduction at 16,384 ranks x 1,000 steps, a dozen of them after the passes).

Each function gives what its groupby gives, the same Series bit for bit (index, dtype, name; a median of an even
count is the mean of the same two middle values), and is the groupby itself for any other frame or for a column
with NaN (which the groupby skips).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def rank_major(rank: np.ndarray, step: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(ranks, the steps of each, in their order) when the rows are rank by rank, every rank the same distinct
    steps in the same order; None otherwise."""
    if not len(rank):
        return None
    other = np.flatnonzero(rank != rank[0])
    per_rank = int(other[0]) if len(other) else len(rank)
    if len(rank) % per_rank:
        return None
    ranks, first = len(rank) // per_rank, step[:per_rank]
    heads = rank[::per_rank]
    if (
        len(np.unique(first)) != per_rank
        or len(np.unique(heads)) != ranks
        or (step.reshape(ranks, per_rank) != first).any()
        or (rank.reshape(ranks, per_rank) != heads[:, None]).any()
    ):
        return None
    return ranks, first


def _matrix(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(the column as a ranks x steps matrix, the ranks in row order, the steps in column order), or None where
    the frame is not rank-major or the column is not plain numpy without NaN."""
    values = frame[column]
    if not isinstance(values.dtype, np.dtype) or values.dtype.kind not in "iuf":
        return None
    rank, step = frame["rank"].to_numpy(), frame["step"].to_numpy()
    layout = rank_major(rank, step)
    if layout is None:
        return None
    ranks, steps = layout
    matrix = values.to_numpy().reshape(ranks, len(steps))
    if matrix.dtype.kind == "f" and np.isnan(matrix).any():
        return None
    return matrix, rank[:: len(steps)], steps


def _reduced(values: np.ndarray, how: str, axis: int) -> np.ndarray:
    return np.median(values, axis=axis) if how == "median" else np.max(values, axis=axis)


def per_step(frame: pd.DataFrame, column: str, how: str = "median") -> pd.Series:
    """``frame.groupby("step")[column].<how>()``, ``how`` median or max."""
    return _per("step", frame, column, how)


def per_rank(frame: pd.DataFrame, column: str, how: str = "median") -> pd.Series:
    """``frame.groupby("rank")[column].<how>()``, ``how`` median or max."""
    return _per("rank", frame, column, how)


def _per(by: str, frame: pd.DataFrame, column: str, how: str) -> pd.Series:
    found = _matrix(frame, column) if len(frame) else None
    if found is None:
        return getattr(frame.groupby(by)[column], how)()
    matrix, ranks, steps = found
    keys, axis = (steps, 0) if by == "step" else (ranks, 1)  # the matrix is ranks x steps
    order = np.argsort(keys, kind="stable")
    return pd.Series(_reduced(matrix, how, axis)[order], index=pd.Index(keys[order], name=by), name=column)


def rank_of_step_max(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per step, the rank of its largest ``column`` (the first in the frame's order on a tie), indexed by step:
    ``frame.loc[frame.groupby("step")[column].idxmax(), ["step", "rank"]].set_index("step")["rank"]``."""
    found = _matrix(frame, column) if len(frame) else None
    if found is None:
        return frame.loc[frame.groupby("step")[column].idxmax(), ["step", "rank"]].set_index("step")["rank"]
    matrix, ranks, steps = found
    order = np.argsort(steps, kind="stable")
    top = np.argmax(matrix, axis=0)[order]  # the first row at the maximum, as idxmax
    # through set_index as the groupby's result goes (it makes the index int64 from an int32 column)
    return pd.DataFrame({"step": steps[order], "rank": ranks[top]}).set_index("step")["rank"]
