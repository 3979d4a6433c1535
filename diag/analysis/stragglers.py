"""Stragglers: ranks whose own work (data wait + compute) is longer than the others', so the others wait.

In synchronous training every rank's iteration lasts as long as the slowest rank's work; the rest is waiting
in collectives. So a rank's *busy* time per step is its data wait plus its step body minus the time it was
blocked in communication. Only durations measured on one host are used: no cross-host clock comparison.

Every comparison is with the *other* ranks (their median, leaving the rank itself out): with two ranks the
median of both is their average, and a rank compared with it looks half as slow as it is. A rank is *slow in
a step* when its busy time exceeds the other ranks' median by more than ``SLOW_FRACTION`` of that median. It
is a *persistent* straggler when slow in at least ``PERSISTENT_FRACTION`` of the steps (and in at least
``MIN_PERSISTENT_STEPS``) and its median busy
time is ``SLOWDOWN_MIN`` above the other ranks'; otherwise occasional large spikes (GC, checkpointing) make it
a *transient* one. What it costs is what the step would shrink if it worked like the others: the step lasts
as long as its busiest rank, so down to the next busiest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import pandas as pd

from diag.analysis import grid
from diag.analysis.findings import Finding, FindingContext, ranks_text, severity_for

SLOW_FRACTION = 0.10
PERSISTENT_FRACTION = 0.5
MIN_PERSISTENT_STEPS = 3  # fewer slow steps than this (a run that failed early) are no evidence of a pattern
MIN_STEPS = 3  # with fewer steps in the window (warm-up included) no rank is named a straggler
SLOWDOWN_MIN = 0.10
SPIKE_FRACTION = 0.5  # a transient spike must add at least this share of the others' median busy time
TRANSIENT_MIN_LOST_FRACTION = 0.01  # report transient stragglers costing at least this share of the run
CAUSE_SHARE = 0.5  # a component explaining this share of a rank's excess is named as the cause
MAX_TRANSIENT = 20


class Cause(str, Enum):
    """Why a straggler is slow, with what to do about it. ``_assign_causes`` tries the rules in this order;
    the values are what the report's JSON says."""

    DATA = (
        "data",
        "Its data loader cannot keep up: raise num_workers, enable pin_memory and prefetch_factor, move "
        "decoding off the critical path, or check the storage this host reads from.",
    )
    THROTTLE = (
        "throttle",
        "Its GPU runs at reduced clocks: check cooling, power capping (nvidia-smi -q -d PERFORMANCE), "
        "and drain the node if it persists.",
    )
    HOST = (
        "host",
        "Every rank on this host is slow: check the host (CPU frequency, other jobs, NUMA binding, network "
        "card) and consider excluding it.",
    )
    MEMORY = (
        "memory",
        "Its memory grows or the allocator retries on this rank only: find what it keeps across steps "
        "(torch.cuda.memory._record_memory_history shows who allocates), and compare its batch shapes with a "
        "peer's.",
    )
    COMPUTE = (
        "compute",
        "This rank does more work or runs on a slower device: check uneven batch or sequence lengths, "
        "a different kernel path (dtype, shapes), or a busy/oversubscribed CPU core; compare its GPU/CPU with a "
        "peer.",
    )
    UNKNOWN = "unknown", "The evidence does not name a cause: profile this rank (torch.profiler) around a slow step."

    def __new__(cls, value: str, advice: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.advice = advice
        return member

    def __str__(self) -> str:  # text views and f-strings show the value, as the JSON does
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class RankStepTimes:
    """Per (rank, step) timings in the window, with the per-step medians the comparisons use."""

    frame: pd.DataFrame  # rank, step, data_wait_us, compute_us, wait_us, busy_us, iteration_us
    wait_source: str  # "steps.comm_wait_us", "collectives" or "none"
    step_median_busy_us: pd.Series | None = None  # per step, computed once when first needed
    step_max_busy_us: pd.Series | None = None
    step_cell: np.ndarray | None = field(default=None, repr=False)  # each row's (peers, step) group, when needed


@dataclass
class Straggler:
    rank: int
    host: str | None
    local_rank: int | None
    gpu: int | None
    slowdown: float  # median busy time / the other ranks' median busy time - 1
    steps_slow_fraction: float
    persistent: bool
    cause: Cause
    time_saved_per_step_s: float  # if this rank alone worked like the others (down to the next busiest rank)
    time_lost_s: float  # the same, summed over the window
    excess_data_wait_ms: float  # median over its slow steps, against the median of the step's other ranks
    excess_compute_ms: float
    last_arrival_fraction: float | None  # share of its collectives where it arrived last
    evidence: list[str] = field(default_factory=list)


@dataclass
class StragglerReport:
    stragglers: list[Straggler] = field(default_factory=list)  # persistent first, then by time lost
    wait_source: str = "none"
    steps: int = 0
    note: str | None = None
    compared: bool = True  # False: ranks were not compared at all (one rank, too few steps, one rank per stage)


def rank_step_times(
    steps_w: pd.DataFrame, coll_wait_per_rank_step: pd.Series | None, peer_groups: dict[int, int] | None = None
) -> RankStepTimes:
    """Busy time per (rank, step): its data wait plus its step body minus the time it waited for others.

    That wait is the larger of the host time blocked in synchronous collectives (steps.csv ``comm_wait_us``)
    and the time its collectives waited for the last rank (from collectives.csv). On CPU (gloo) jobs the
    first covers everything; with asynchronous collectives (DDP buckets, NCCL) the host may never block in
    one, and only the second sees the waiting.

    ``peer_groups`` (rank -> group) limits comparisons to ranks doing the same work: the ranks of one
    pipeline stage. Without it all ranks are peers."""
    frame = steps_w[["rank", "step", "data_wait_us", "duration_us", "comm_wait_us"]].copy()
    blocked = frame["comm_wait_us"].to_numpy(dtype="float64")
    sources = ["steps.comm_wait_us"] if blocked.any() else []
    if coll_wait_per_rank_step is not None and len(coll_wait_per_rank_step):
        from_collectives = _aligned(coll_wait_per_rank_step, frame["rank"].to_numpy(), frame["step"].to_numpy())
        if from_collectives.any():
            sources.append("collectives")
            blocked = np.maximum(blocked, from_collectives)
    frame = frame.drop(columns="comm_wait_us")
    frame["wait_us"] = blocked
    frame["compute_us"] = (frame["duration_us"] - frame["wait_us"]).clip(lower=0)
    frame["busy_us"] = frame["compute_us"] + frame["data_wait_us"]
    frame["iteration_us"] = (frame["data_wait_us"] + frame["duration_us"]).astype("float64")
    source = f"max({', '.join(sources)})" if len(sources) > 1 else (sources[0] if sources else "none")
    if peer_groups:
        frame["peers"] = frame["rank"].map(peer_groups).fillna(0).astype("int64")
    else:  # what mapping every rank through an empty dict gives, without 16 M lookups
        frame["peers"] = np.zeros(len(frame), dtype="int64")
    return RankStepTimes(frame.reset_index(drop=True), source)


def _aligned(per_rank_step: pd.Series, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``per_rank_step`` (indexed by (rank, step)) at each (rank, step) of the rows, 0 where it has none: its
    values as they are when its index is those rows in their order (the partitioned path's is, rank by rank:
    no 16 M-row hash join), else ``reindex``."""
    index = per_rank_step.index
    if (
        isinstance(index, pd.MultiIndex)
        and index.nlevels == 2
        and len(index) == len(rank)
        and np.array_equal(index.get_level_values(0).to_numpy(), rank)
        and np.array_equal(index.get_level_values(1).to_numpy(), step)
    ):
        return per_rank_step.to_numpy(dtype="float64")
    return per_rank_step.reindex(pd.MultiIndex.from_arrays([rank, step]), fill_value=0.0).to_numpy()


def find_stragglers(
    times: RankStepTimes,
    ranks_info: pd.DataFrame,
    throttled: dict[int, float],
    last_arrival: dict[int, float],
    memory_pressure: dict[int, str] | None = None,
) -> StragglerReport:
    """``ranks_info``: rank-indexed host, local_rank, gpu; ``throttled``: rank -> share of throttled samples, for
    the ranks whose GPU the telemetry analysis calls throttled;
    ``memory_pressure``: rank -> what the memory analysis saw (a leak, allocator retries) on that rank."""
    f = times.frame
    layout = _rank_major(f)  # the usual layout: ranks and steps counted without hashing 16 M rows
    report = StragglerReport(
        wait_source=times.wait_source, steps=len(layout[1]) if layout else int(f["step"].nunique())
    )
    if (layout[0] if layout else f["rank"].nunique()) < 2:
        report.note = "one rank only: nothing to compare it with"
        report.compared = False
        return report
    if report.steps < MIN_STEPS:
        report.note = f"only {report.steps} step(s) analysed: too few to tell a straggler from warm-up or noise"
        report.compared = False
        return report
    if (layout[0] if layout else f.groupby("peers")["rank"].nunique().max()) < 2:
        report.note = "pipeline parallel with one rank per stage: stages do different work, so ranks are not compared (see the pipeline bubble report)"
        report.compared = False
        return report
    if layout is None and f["peers"].nunique() > 1:
        report.note = "pipeline parallel: each rank is compared with the ranks of its own stage"
    if times.wait_source == "none":
        report.note = "no communication wait recorded: stragglers can only show in their data wait"
    cell = step_cells(f, sort=False)
    rows = _regular_rows(f)
    rows = cell_rows(cell) if rows is None else rows  # sorted once for the three comparisons
    f = f.assign(
        others_busy_us=others_median(f["busy_us"].to_numpy(dtype="float64"), cell, rows),
        others_data_us=others_median(f["data_wait_us"].to_numpy(dtype="float64"), cell, rows),
        others_compute_us=others_median(f["compute_us"].to_numpy(dtype="float64"), cell, rows),
    )
    excess = f["busy_us"] - f["others_busy_us"]
    f["slow"] = excess > SLOW_FRACTION * f["others_busy_us"]
    f["spike"] = excess > SPIKE_FRACTION * f["others_busy_us"]
    saved = _saved_per_rank_step(f)
    per_rank = _per_rank(f)
    per_rank["saved_us"] = saved.reindex(per_rank.index, fill_value=0.0)
    others_busy = others_median(per_rank["busy_median_us"].to_numpy(dtype="float64"), per_rank["peers"].to_numpy())
    per_rank["slowdown"] = np.nan_to_num(
        per_rank["busy_median_us"].to_numpy() / np.where(others_busy > 0, others_busy, np.nan) - 1, nan=0.0
    )
    n_steps = report.steps
    total_time_us = float(grid.per_step(f, "iteration_us", "max").sum())
    persistent = per_rank[
        (per_rank["slow_fraction"] >= PERSISTENT_FRACTION)
        & (per_rank["slow_steps"] >= MIN_PERSISTENT_STEPS)
        & (per_rank["slowdown"] >= SLOWDOWN_MIN)
    ]
    transient = per_rank[
        (per_rank["spikes"] > 0)
        & ~per_rank.index.isin(persistent.index)
        & (per_rank["saved_us"] >= TRANSIENT_MIN_LOST_FRACTION * total_time_us)
    ].nlargest(MAX_TRANSIENT, "saved_us")
    persistent_ranks = set(persistent.index)
    for rank, row in pd.concat([persistent, transient]).iterrows():
        mine = f[(f["rank"] == rank) & (f["slow"] if rank in persistent_ranks else f["spike"])]
        excess_data = float((mine["data_wait_us"] - mine["others_data_us"]).median())
        excess_compute = float((mine["compute_us"] - mine["others_compute_us"]).median())
        info = ranks_info.loc[rank] if rank in ranks_info.index else None
        straggler = Straggler(
            rank=int(rank),
            host=_get(info, "host"),
            local_rank=_get_int(info, "local_rank"),
            gpu=_get_int(info, "gpu_index"),
            slowdown=float(row["slowdown"]),
            steps_slow_fraction=float(row["slow_fraction"]),
            persistent=rank in persistent_ranks,
            cause=Cause.UNKNOWN,
            time_saved_per_step_s=float(row["saved_us"]) / n_steps / 1e6,
            time_lost_s=float(row["saved_us"]) / 1e6,
            excess_data_wait_ms=excess_data / 1e3,
            excess_compute_ms=excess_compute / 1e3,
            last_arrival_fraction=last_arrival.get(int(rank)),
        )
        report.stragglers.append(straggler)
    _assign_causes(report.stragglers, ranks_info, throttled, persistent_ranks, memory_pressure or {})
    report.stragglers.sort(key=lambda s: (not s.persistent, -s.time_lost_s))
    return report


def _per_rank(f: pd.DataFrame) -> pd.DataFrame:
    """Each rank's median busy time, share and count of slow steps, spikes and peers group: the groupby's
    frame, from the ranks x steps matrices where the frame is the usual one (diag.analysis.grid)."""
    layout = _rank_major(f)
    if layout is None or np.isnan(f["busy_us"].to_numpy(dtype="float64")).any():
        return f.groupby("rank").agg(
            busy_median_us=("busy_us", "median"),
            slow_fraction=("slow", "mean"),
            slow_steps=("slow", "sum"),
            spikes=("spike", "sum"),
            peers=("peers", "first"),
        )
    ranks, steps = layout
    heads = f["rank"].to_numpy()[:: len(steps)]
    order = np.argsort(heads, kind="stable")
    slow = f["slow"].to_numpy().reshape(ranks, len(steps))[order]
    spike = f["spike"].to_numpy().reshape(ranks, len(steps))[order]
    return pd.DataFrame(
        {
            "busy_median_us": grid.per_rank(f, "busy_us").to_numpy(),
            "slow_fraction": slow.mean(axis=1),
            "slow_steps": slow.sum(axis=1),
            "spikes": spike.sum(axis=1),
            "peers": f["peers"].to_numpy()[:: len(steps)][order],
        },
        index=pd.Index(heads[order], name="rank"),
    )


def others_median(values: np.ndarray, cells: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """For each element, the median of the *other* elements of its cell (NaN when it is alone in it).

    ``rows``: the cells as a (cells x width) matrix of element indexes (``cell_rows``), when the caller has it
    (find_stragglers asks three times of the same cells). When every cell holds as many elements (every rank in
    every step: the usual case) the cells are the rows of that matrix and only their middle order statistics
    are needed (``_others_median_rows``); otherwise each cell is sorted once: leaving out the element at sorted
    position p, the k-th remaining value is the k-th sorted one when k < p, else the (k+1)-th."""
    values = np.asarray(values, dtype="float64")
    if not len(values):
        return values.copy()
    cells = np.asarray(cells)
    if rows is None:
        rows = cell_rows(cells)
    if rows is not None:
        return _others_median_rows(values, rows)
    order = np.lexsort((values, cells))
    v, c = values[order], cells[order]
    starts = np.r_[0, np.flatnonzero(c[1:] != c[:-1]) + 1]
    sizes = np.diff(np.r_[starts, len(v)])
    start, n = np.repeat(starts, sizes), np.repeat(sizes, sizes)
    position = np.arange(len(v)) - start
    remaining = n - 1

    def kth_remaining(k: np.ndarray) -> np.ndarray:
        k = np.clip(k, 0, None)
        return v[np.minimum(start + k + (k >= position), len(v) - 1)]

    lower, upper = kth_remaining((remaining - 1) // 2), kth_remaining(remaining // 2)
    out = np.empty(len(v))
    out[order] = np.where(remaining > 0, (lower + upper) / 2, np.nan)
    return out


def _rank_major(f: pd.DataFrame) -> tuple[int, np.ndarray] | None:
    """(ranks, the steps of each) when the rows are the usual layout (diag.analysis.grid.rank_major) with one
    peers group (no pipeline stages). None otherwise."""
    peers = f["peers"].to_numpy()
    if not len(peers) or (peers != peers[0]).any():
        return None
    return grid.rank_major(f["rank"].to_numpy(), f["step"].to_numpy())


def step_cells(f: pd.DataFrame, sort: bool) -> np.ndarray:
    """Each row's (peers, step) cell as ``f.groupby(["peers", "step"], sort=sort).ngroup()`` numbers it; from the
    layout where it is the usual one (``_rank_major``), without grouping 16 M rows (~1 s each time)."""
    layout = _rank_major(f)
    if layout is None:
        return f.groupby(["peers", "step"], sort=sort).ngroup().to_numpy()
    ranks, steps = layout
    codes = np.argsort(np.argsort(steps, kind="stable"), kind="stable") if sort else np.arange(len(steps))
    return np.tile(codes, ranks)


def _regular_rows(f: pd.DataFrame) -> np.ndarray | None:
    """``cell_rows`` of ``step_cells(f, sort=False)`` from the layout where it is the usual one (no sort)."""
    layout = _rank_major(f)
    if layout is None:
        return None
    ranks, steps = layout
    return np.arange(ranks * len(steps)).reshape(ranks, len(steps)).T


def cell_rows(cells: np.ndarray) -> np.ndarray | None:
    """The element indexes of each cell as the rows of a (cells x width) matrix, cells in the order of their
    codes and each cell's elements in their order; None unless every cell holds as many elements."""
    cells = np.asarray(cells)
    by_cell = np.argsort(cells, kind="stable")
    sorted_cells = cells[by_cell]
    starts = np.r_[0, np.flatnonzero(sorted_cells[1:] != sorted_cells[:-1]) + 1]
    width = len(cells) // len(starts)
    if width * len(starts) != len(cells) or not np.all(np.diff(np.r_[starts, len(cells)]) == width):
        return None
    return by_cell.reshape(-1, width)


def _others_median_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``others_median`` where the cells are the rows of ``rows``: the median of the others is the mean of two
    order statistics of the remaining ``width - 1`` elements, the k-th remaining being the row's k-th smallest
    if the element is above it (it was left out after it), else the (k+1)-th. Only those order statistics are
    selected (``np.partition``), not whole rows sorted: 0.4 s instead of 2.4 s for 16,384 ranks x 1,000 steps.
    NaN is above every number, as sorting puts it. The same floats as sorting each cell: the same two values
    are averaged."""
    out = np.empty(len(values))
    width = rows.shape[1]
    if width < 2:
        out[rows] = np.nan
        return out
    matrix = values[rows]
    low, high = (width - 2) // 2, (width - 1) // 2  # (remaining - 1) // 2 and remaining // 2
    ordered = np.partition(matrix, sorted({low, low + 1, high, high + 1}), axis=1)
    above = np.isnan(matrix)

    def kth_remaining(k: int) -> np.ndarray:
        kth, next_kth = ordered[:, k : k + 1], ordered[:, k + 1 : k + 2]
        return np.where((matrix > kth) | above, kth, next_kth)

    out[rows] = (kth_remaining(low) + kth_remaining(high)) / 2
    return out


def joint_saving_us(times: RankStepTimes, ranks: list[int]) -> float:
    """Time the window would lose less if all of ``ranks`` worked like the other ranks of their step.

    The step then lasts as long as the busiest of the others; where ``ranks`` are all the ranks of a step,
    nothing is left to compare them with, and the step's median is what they could reach."""
    f = times.frame
    if times.step_median_busy_us is None:
        times.step_median_busy_us = _by_peers_step(f, "median")
        times.step_max_busy_us = _by_peers_step(f, "max")
    median, slowest = times.step_median_busy_us, times.step_max_busy_us
    others = _others_max(times, ranks) if len(f) >= 1 << 16 else None
    if others is None:
        others = f[~f["rank"].isin(ranks)].groupby(["peers", "step"])["busy_us"].max().reindex(slowest.index)
    return float((slowest - others.fillna(median)).clip(lower=0).sum())


def _by_peers_step(f: pd.DataFrame, how: str) -> pd.Series:
    """``f.groupby(["peers", "step"])["busy_us"].<how>()``: in the usual layout (one peers group), the steps'
    medians or maxima over the ranks x steps matrix (diag.analysis.grid) under the groupby's index."""
    if _rank_major(f) is None:
        return getattr(f.groupby(["peers", "step"])["busy_us"], how)()
    by_step = grid.per_step(f, "busy_us", how)
    peers = np.full(len(by_step), f["peers"].iat[0], dtype=f["peers"].dtype)
    index = pd.MultiIndex.from_arrays([peers, by_step.index], names=["peers", "step"])
    return pd.Series(by_step.to_numpy(), index=index, name="busy_us")


def _others_max(times: RankStepTimes, ranks: list[int]) -> pd.Series | None:
    """Per (peers, step), the busiest of the ranks not in ``ranks`` (NaN: none), indexed as step_max_busy_us:
    a maximum per cell over the rows instead of a filtered copy of the frame and a groupby for each call
    (~1.7 s each at 16,384 ranks x 1,000 steps). None where the groups are not one per cell (a NaN key)."""
    f, slowest = times.frame, times.step_max_busy_us
    if times.step_cell is None:
        times.step_cell = step_cells(f, sort=True)
    cell, cells = times.step_cell, len(slowest)
    if not len(cell) or cell.min() < 0 or cell.max() + 1 != cells:
        return None
    busy = f["busy_us"].to_numpy(dtype="float64")
    keep = ~np.isin(f["rank"].to_numpy(), np.asarray(list(ranks))) & ~np.isnan(busy)  # groupby's max skips NaN
    best = np.full(cells, -np.inf)
    np.maximum.at(best, cell[keep], busy[keep])
    best[np.bincount(cell[keep], minlength=cells) == 0] = np.nan
    return pd.Series(best, index=slowest.index)


def _saved_per_rank_step(f: pd.DataFrame) -> pd.Series:
    """Per rank, summed over steps: what the step would shrink if that rank alone worked like the others.

    Only the busiest rank of a step can shorten it, and only down to the next busiest: that rank's busy time
    is at least the others' median, which is what the busiest would come down to."""
    busy, step, peers = f["busy_us"].to_numpy(), f["step"].to_numpy(), f["peers"].to_numpy()
    if len(busy) >= 1 << 16 and not np.isnan(busy.astype("float64")).any():
        return _saved_per_rank_step_by_cell(f)
    order = np.lexsort((-busy, step, peers))
    busy, step, peers, rank = busy[order], step[order], peers[order], f["rank"].to_numpy()[order]
    new_cell = np.r_[True, (step[1:] != step[:-1]) | (peers[1:] != peers[:-1])]
    top = np.flatnonzero(new_cell)  # the busiest rank of each step (among its peers)
    nxt = np.minimum(top + 1, len(step) - 1)
    has_second = (top + 1 < len(step)) & ~new_cell[nxt]
    saved = np.where(has_second, np.clip(busy[top] - busy[nxt], 0, None), 0.0)
    return pd.Series(saved, index=rank[top]).groupby(level=0).sum()


def _saved_per_rank_step_by_cell(f: pd.DataFrame) -> pd.Series:
    """``_saved_per_rank_step`` without sorting the rows (its lexsort of 16 M rank-steps was ~7 s at 16,384
    ranks): each step's busiest and second busiest by a maximum per cell. The same Series: the busiest is the
    first row (in the frame's order) at the cell's maximum, as the stable lexsort puts it; the cells are summed
    per rank in the same (peers, step) order. No NaN busy time (the caller checks)."""
    busy = f["busy_us"].to_numpy(dtype="float64")
    cell = step_cells(f, sort=True)
    cells = int(cell.max()) + 1
    first = np.full(cells, -np.inf)
    np.maximum.at(first, cell, busy)
    at_max = np.flatnonzero(busy == first[cell])  # about one row per cell (ties are rare)
    _, earliest = np.unique(cell[at_max], return_index=True)
    top = at_max[earliest]  # by cell, in (peers, step) order
    rest = busy.copy()
    rest[top] = -np.inf
    second = np.full(cells, -np.inf)
    np.maximum.at(second, cell, rest)
    has_second = np.bincount(cell, minlength=cells) > 1
    saved = np.where(has_second, np.clip(first - second, 0, None), 0.0)
    return pd.Series(saved, index=f["rank"].to_numpy()[top]).groupby(level=0).sum()


def _assign_causes(
    stragglers: list[Straggler],
    ranks_info: pd.DataFrame,
    throttled: dict[int, float],
    persistent: set,
    memory_pressure: dict[int, str],
) -> None:
    slow_hosts = _hosts_all_slow(stragglers, ranks_info, persistent)
    for s in stragglers:
        excess = max(s.excess_data_wait_ms, 0) + max(s.excess_compute_ms, 0)
        if excess <= 0:
            s.cause = Cause.UNKNOWN
        elif s.excess_data_wait_ms >= CAUSE_SHARE * excess:
            s.cause = Cause.DATA
            s.evidence.append(
                f"waits {s.excess_data_wait_ms:.1f} ms longer than the other ranks (their median) for its batch"
            )
        elif s.rank in throttled:
            s.cause = Cause.THROTTLE
            s.evidence.append(f"its GPU's clocks were throttled in {100 * throttled[s.rank]:.0f}% of telemetry samples")
        elif s.host is not None and s.host in slow_hosts:
            s.cause = Cause.HOST
            s.evidence.append(f"every rank on host {s.host} is slow")
        elif s.excess_compute_ms >= CAUSE_SHARE * excess and s.rank in memory_pressure:
            # extra time in the step body on the rank whose memory misbehaves: allocating and filling what it
            # keeps, or the caching allocator freeing and retrying near the limit, is where the time goes
            s.cause = Cause.MEMORY
            s.evidence.append(
                f"its step body computes {s.excess_compute_ms:.1f} ms longer than the other ranks (their median), "
                f"and {memory_pressure[s.rank]}"
            )
        elif s.excess_compute_ms >= CAUSE_SHARE * excess:
            s.cause = Cause.COMPUTE
            s.evidence.append(
                f"its step body computes {s.excess_compute_ms:.1f} ms longer than the other ranks (their median)"
            )
        if s.excess_compute_ms > 0 and s.cause not in (Cause.COMPUTE, Cause.MEMORY):
            s.evidence.append(f"compute {s.excess_compute_ms:.1f} ms above the other ranks' median")
        if s.last_arrival_fraction is not None:
            s.evidence.append(f"arrived last at {100 * s.last_arrival_fraction:.0f}% of its collectives")
        what = "of the steps" if s.persistent else "(spikes only)"
        s.evidence.append(
            f"slow in {100 * s.steps_slow_fraction:.0f}% {what}; median work {100 * s.slowdown:+.0f}% vs the other ranks"
        )


def _hosts_all_slow(stragglers: list[Straggler], ranks_info: pd.DataFrame, persistent: set) -> set[str]:
    if "host" not in ranks_info or ranks_info["host"].nunique() < 2:
        return set()
    per_host = ranks_info.groupby("host").size()
    slow = pd.Series([s.host for s in stragglers if s.rank in persistent and s.host]).value_counts()
    return {h for h, n in slow.items() if per_host.get(h, 0) >= 2 and n == per_host[h]}


def _get(info, key):
    if info is None or key not in info or pd.isna(info[key]):
        return None
    return str(info[key])


def _get_int(info, key):
    if info is None or key not in info or pd.isna(info[key]):
        return None
    return int(info[key])


# -- findings --------------------------------------------------------------------------------------------------
def straggler_findings(report: StragglerReport, ctx: FindingContext) -> list[Finding]:
    """One finding per cause among persistent stragglers, one for all transient ones.

    Only the slowest rank of a step sets its length, so fixing one straggler helps only down to the next one.
    Causes are credited in a waterfall, worst first: each gets what fixing it saves once the worse ones are
    fixed, and the credits add up to what fixing them all would save."""
    times, step_s = ctx.times, ctx.step_s
    out = []
    persistent = [s for s in report.stragglers if s.persistent]
    causes = sorted({s.cause for s in persistent}, key=lambda c: -max(s.slowdown for s in persistent if s.cause == c))
    fixed: list[int] = []
    saved_before_us = 0.0
    all_us = joint_saving_us(times, [s.rank for s in persistent]) if persistent else 0.0
    for cause in causes:
        group = [s for s in persistent if s.cause == cause]
        fixed += [s.rank for s in group]
        saved_us = joint_saving_us(times, fixed)
        finding = _straggler_finding("straggler", group, saved_us - saved_before_us, report.steps, step_s, cause)
        if len(causes) > 1:
            finding.evidence.append(
                f"fixing every persistent straggler would save {all_us / max(report.steps, 1) / 1e3:.1f} ms/step; this one is credited what it adds once the slower ones are fixed"
            )
        out.append(finding)
        saved_before_us = saved_us
    transient = [s for s in report.stragglers if not s.persistent]
    if transient:
        lost_us = sum(s.time_lost_s for s in transient) * 1e6
        out.append(_straggler_finding("transient_straggler", transient, lost_us, report.steps, step_s, None))
    return out


def _straggler_finding(kind, group: list[Straggler], lost_us: float, steps: int, step_s, cause) -> Finding:
    ranks = [s.rank for s in group]
    per_step = lost_us / steps / 1e6 if steps else 0.0
    who = ranks_text(ranks)
    if kind == "straggler":
        worst = max(group, key=lambda s: s.slowdown)
        title = (
            f"{who[0].upper()}{who[1:]} {'is a' if len(ranks) == 1 else 'are'} persistent straggler{'s' * (len(ranks) > 1)} ({cause}): "
            f"{100 * worst.slowdown:+.0f}% work, costs the job {per_step * 1e3:.1f} ms/step"
        )
        advice = Cause(cause).advice
    else:
        title = f"Occasional slow steps on {who} (transient spikes) cost {per_step * 1e3:.1f} ms/step on average"
        advice = "One-off slow steps: look for garbage collection (gc.freeze / gc.disable in the loop), checkpointing or logging on these ranks at those steps."
    evidence = [f"rank {s.rank}: {e}" for s in group[:5] for e in s.evidence]
    return Finding(
        kind=kind,
        severity=severity_for(per_step, step_s),
        title=title,
        ranks=ranks,
        time_lost_s=lost_us / 1e6,
        time_lost_per_step_s=per_step,
        evidence=evidence,
        advice=advice,
        hosts=sorted({s.host for s in group if s.host}),
        gpus=[f"{s.host}:{s.gpu}" for s in group if s.gpu is not None],
    )
