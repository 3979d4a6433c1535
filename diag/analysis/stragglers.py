"""Stragglers: ranks whose own work (data wait + compute) is longer than the others', so the others wait.

In synchronous training every rank's iteration lasts as long as the slowest rank's work; the rest is waiting
in collectives. So a rank's *busy* time per step is its data wait plus its step body minus the time it was
blocked in communication. Ranks are judged on their *work*: busy time less the time their thread waited for a
core (``runqueue_wait_us``: on a loaded host the scheduler leaves one rank or another waiting, which is the
host's doing, not the rank's); what a straggler costs is busy (wall) time, which the others wait. Only
durations measured on one host are used: no cross-host clock comparison.

Every comparison is with the *other* ranks (their median, leaving the rank itself out): with two ranks the
median of both is their average, and a rank compared with it looks half as slow as it is. A rank is *slow in
a step* when its busy time is over the other ranks' median by more than ``SLOW_FRACTION`` of that median. Its
*excess* in a step is its busy time over the other ranks' median in units of the run's typical busy time (the
median over all its peers' steps: a step's own median would make spikes of the steps where the others happened
to be quick).

Each rank is judged against the run's own noise, because hosts are noisy (OS jitter, garbage collection,
other work on a shared host) and a tool that calls every noisy run a straggler is switched off:

* the *step spread*: how much a rank's excess moves from step to step (a robust sigma, 1.4826 x the median
  absolute deviation, per rank; the run's is the median over ranks, so one erratic rank does not set it);
* the *rank spread*: how far healthy ranks' slowdowns lie apart (the same robust sigma over the ranks under
  ``SLOWDOWN_MIN``, which cannot be stragglers, with 3 or more ranks; with 2, every difference is one rank
  against the other and says nothing about the spread).

A *persistent* straggler is slow in at least ``PERSISTENT_FRACTION`` of the steps (and in at least
``MIN_PERSISTENT_STEPS``), with a median busy time ``SLOWDOWN_MIN`` above the other ranks' and at least
``NAMED_Z`` times its noise (the standard error of its median excess from the step spread, and the rank
spread), and the others wait for it: its wall-clock busy time is ``WAITED_FOR_MIN`` over theirs too (on a
loaded host a rank that got more of a core than its peers shows more work and waits as long as they do). A
*spike* is a step whose excess is above ``SPIKE_FRACTION`` and ``SPIKE_Z`` step spreads; a spike is the rank's
*own* when it is also ``OWN_SPIKE_RATIO`` times the largest excess the other ranks show (the
``OTHERS_LARGEST_QUANTILE`` quantile of each one's largest, so that one other straggler does not hide it):
spikes that every rank has are the host's jitter, not a straggler. A rank with own spikes is a *transient*
straggler; slow steps that no single rank explains are the job's *jitter*, a finding of its own, low unless it
costs much.

Severity is the cost's (``findings.severity_for``) capped by the confidence: ``high`` needs ``STEPS_FOR``
["high"] steps and an effect of ``Z_FOR["high"]`` noise sigmas (a persistent straggler, whose wall-clock excess,
which the others wait, must also be ``WAITED_Z`` sigmas of the wall-clock noise where the wait for a core was
taken out of its work) or ``SPIKES_FOR["high"]`` own spikes (a transient one), likewise ``medium``; less evidence
is ``low``.

What a straggler costs: the step lasts as long as its busiest rank, so fixing one rank alone saves down to the
next busiest (``time_saved_per_step_s``: nothing while a worse rank remains), and the job's loss is credited
to stragglers in a waterfall, worst first (``cost_per_step_s``: what fixing it adds once the worse ones are
fixed; the costs add up to what fixing them all would save).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import pandas as pd

from diag.analysis import grid
from diag.analysis.findings import SEVERITY_ORDER, Finding, FindingContext, ranks_text, severity_for
from diag.analysis.mesh import MeshPlacement
from diag.analysis.section import Section, json_safe

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("data_wait_us", "duration_us", "comm_wait_us", "runqueue_wait_us", "thread_cpu_us")}

SLOW_FRACTION = 0.10
PERSISTENT_FRACTION = 0.5
MIN_PERSISTENT_STEPS = 3  # fewer slow steps than this (a run that failed early) are no evidence of a pattern
MIN_STEPS = 3  # with fewer steps in the window (warm-up included) no rank is named a straggler
SLOWDOWN_MIN = 0.10
SPIKE_FRACTION = 0.5  # a transient spike must add at least this share of the others' median busy time
TRANSIENT_MIN_LOST_FRACTION = 0.01  # report transient stragglers costing at least this share of the run
CAUSE_SHARE = 0.5  # a component explaining this share of a rank's excess is named as the cause
MAX_TRANSIENT = 20
SPREAD_PER_MAD = 1.4826  # a normal distribution's sigma per median absolute deviation
MEDIAN_STANDARD_ERROR = 1.2533  # the standard error of a median of n samples, in sigma / sqrt(n)
NAMED_Z = 3.0  # a persistent straggler's slowdown is at least this many noise sigmas
WAITED_FOR_MIN = SLOWDOWN_MIN / 2  # ... and its wall-clock busy time at least this far over the others'
WAITED_Z = 2.0  # above low, that wall-clock excess is at least this many sigmas of the wall-clock noise
SPIKE_Z = 4.0  # a spike's excess is at least this many step spreads
OWN_SPIKE_RATIO = 2.5  # an own spike is this many times the largest excess the other ranks show
OTHERS_LARGEST_QUANTILE = 0.9  # "the largest the other ranks show": this quantile of each one's largest excess
Z_FOR = {"high": 6.0, "medium": 4.0}  # a persistent straggler's slowdown in noise sigmas, for each severity
SPIKES_FOR = {"high": 3, "medium": 3}  # a transient straggler's own spikes, for each severity: 2 are chance
MAX_INDEPENDENT_STEPS = 10  # host noise comes in stretches: more steps are not more independent samples
STEPS_FOR = {"high": 10, "medium": 5}  # steps analysed, for each severity: 4 steps are not a pattern
JITTER_MEDIUM_SHARE = 0.5  # job-wide jitter is medium from this share of the step (and STEPS_FOR["high"]) ...
JITTER_HICCUP_FRACTION = 0.2  # ... when in at most this share of the steps (hiccups, not a noisy host)
MAX_LISTED_STEPS = 20
LARGE_SLOWDOWN = 10.0  # from this slowdown (+1000%) a straggler's extra work is said in milliseconds


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

    frame: pd.DataFrame  # rank, step, data_wait_us, compute_us, wait_us, busy_us, work_us, iteration_us
    wait_source: str  # "steps.comm_wait_us", "collectives" or "none"
    less_core_wait: bool = False  # work_us excludes the time the thread waited for a core (steps.runqueue_wait_us)
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
    cost_per_step_s: float = 0.0  # what the job loses to it: its credit in the waterfall, worst first
    slower_rank: int | None = None  # a worse straggler that still sets the step if this one alone is fixed
    noise_z: float | None = None  # a persistent straggler's slowdown in sigmas of its noise
    wall_slowdown: float | None = None  # its median wall-clock busy time (which the others wait) over theirs - 1
    waited_z: float | None = None  # ... in sigmas of the wall-clock noise
    confidence: str = "low"  # the most severe grade the evidence allows (steps, noise sigmas, own spikes)
    spike_steps: list[int] = field(default_factory=list)  # a transient straggler's own spikes
    mesh: MeshPlacement | None = None  # where it sits in the device mesh and the group it holds up; None: no mesh
    evidence: list[str] = field(default_factory=list)


@dataclass
class StepNoise:
    """The run's own noise, against which each rank is judged (see the module's doc)."""

    step_spread: float = 0.0  # robust sigma of a rank's excess from step to step (median over ranks)
    rank_spread: float = 0.0  # robust sigma of the ranks' slowdowns (0 with fewer than 3 ranks)
    spike_threshold: float = SPIKE_FRACTION  # an excess above this is a spike


@dataclass
class Jitter:
    """Slow steps that no single rank explains: the host's or the job's jitter, not a straggler."""

    steps: list[int]  # steps slower than SPIKE_FRACTION over the median step, without a straggler's own spike
    median_step_s: float
    time_lost_s: float  # their time above the median step
    time_lost_per_step_s: float
    busiest_ranks: list[tuple[int, int]]  # (rank, in how many of those steps it was the busiest), most first


@dataclass
class StragglerReport:
    stragglers: list[Straggler] = field(default_factory=list)  # persistent first, then by time lost
    wait_source: str = "none"
    less_core_wait: bool = False  # busy time excludes the time the ranks' threads waited for a core
    steps: int = 0
    note: str | None = None
    compared: bool = True  # False: ranks were not compared at all (one rank, too few steps, one rank per stage)
    noise: StepNoise | None = None
    jitter: Jitter | None = None


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
    # renumbered from 0 here, while it has five columns: renumbering the finished frame would copy all ten
    frame = steps_w[["rank", "step", "data_wait_us", "duration_us", "comm_wait_us"]].reset_index(drop=True)
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
    work_us, less_core_wait = _less_core_wait(frame["compute_us"].to_numpy(dtype="float64"), steps_w)
    frame["work_us"] = work_us + frame["data_wait_us"].to_numpy(dtype="float64")
    frame["iteration_us"] = (frame["data_wait_us"] + frame["duration_us"]).astype("float64")
    source = f"max({', '.join(sources)})" if len(sources) > 1 else (sources[0] if sources else "none")
    if peer_groups:
        frame["peers"] = frame["rank"].map(peer_groups).fillna(0).astype("int64")
    else:  # what mapping every rank through an empty dict gives, without 16 M lookups
        frame["peers"] = np.zeros(len(frame), dtype="int64")
    return RankStepTimes(frame, source, less_core_wait=less_core_wait)


def _less_core_wait(busy_us: np.ndarray, steps_w: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """Per row, the step's busy time less the time its thread waited for a core (other load on the host, which
    slows whichever rank the scheduler happens to leave waiting, and is not the rank's work), and whether any
    row had that wait recorded.

    The wait also accrues inside the collective waits already taken out (a thread woken from one waits for a
    core too), so the difference can fall below the work itself; the thread's time on a core in the step
    bounds it from below (itself at most the busy time: a thread spinning in a wait is on a core)."""
    if "runqueue_wait_us" not in steps_w or "thread_cpu_us" not in steps_w:
        return busy_us, False
    wait = np.clip(steps_w["runqueue_wait_us"].to_numpy(dtype="float64", na_value=np.nan), 0.0, None)
    on_core = steps_w["thread_cpu_us"].to_numpy(dtype="float64", na_value=np.nan)
    recorded = ~np.isnan(wait) & ~np.isnan(on_core)  # the wait alone, unbounded, is noisier than busy time
    if not recorded.any():
        return busy_us, False
    less = np.maximum(np.clip(busy_us - np.nan_to_num(wait), 0.0, None), np.minimum(busy_us, np.nan_to_num(on_core)))
    return np.where(recorded, less, busy_us), True


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
    stage_work_us: pd.Series | None = None,
    place: Callable[[int], MeshPlacement | None] | None = None,
) -> StragglerReport:
    """``ranks_info``: rank-indexed host, local_rank, gpu; ``throttled``: rank -> share of throttled samples, for
    the ranks whose GPU the telemetry analysis calls throttled;
    ``memory_pressure``: rank -> what the memory analysis saw (a leak, allocator retries) on that rank;
    ``stage_work_us``: a pipeline's compute work per (rank, step) (diag.analysis.bubble), when it has one;
    ``place``: a rank -> where it sits in the device mesh (diag.analysis.mesh.place_rank), for a run on one."""
    f = times.frame
    layout = _rank_major(f)  # the usual layout: ranks and steps counted without hashing 16 M rows
    report = StragglerReport(
        wait_source=times.wait_source,
        less_core_wait=times.less_core_wait,
        steps=len(layout[1]) if layout else int(f["step"].nunique()),
    )
    if (layout[0] if layout else f["rank"].nunique()) < 2:
        report.note = "one rank only: nothing to compare it with"
        report.compared = False
        return report
    if report.steps < MIN_STEPS:
        report.note = f"only {report.steps} step(s) analysed: too few to tell a straggler from warm-up or noise"
        report.compared = False
        return report
    one_rank_per_stage = (layout[0] if layout else f.groupby("peers")["rank"].nunique().max()) < 2
    if one_rank_per_stage:
        times = _across_stages(times, stage_work_us)
        if times is None:
            report.note = "pipeline parallel with one rank per stage: stages do different work, so ranks are not compared (see the pipeline bubble report)"
            report.compared = False
            return report
        f, layout = times.frame, None
        report.note = (
            "pipeline parallel with one rank per stage: stages do different work, so ranks are compared on their "
            "data wait and on their compute against their own usual step (see the pipeline bubble report for a "
            "stage that always computes longer)"
        )
    if layout is None and f["peers"].nunique() > 1:
        report.note = "pipeline parallel: each rank is compared with the ranks of its own stage"
    if times.wait_source == "none":
        report.note = "no communication wait recorded: stragglers can only show in their data wait"
    # ranks are judged on their work (busy time less the wait for a core: a loaded host's doing, not the
    # rank's); what the job loses to a straggler is wall time, which the others wait (savings, costs, jitter)
    wall = f
    if times.less_core_wait:
        f = f.assign(busy_us=f["work_us"])
    cell = step_cells(f, sort=False)
    rows = _regular_rows(f)
    rows = cell_rows(cell) if rows is None else rows  # sorted once for the comparisons
    f = f.assign(
        others_data_us=others_median(f["data_wait_us"].to_numpy(dtype="float64"), cell, rows),
        others_compute_us=others_median(f["compute_us"].to_numpy(dtype="float64"), cell, rows),
    )
    f, per_rank, noise = _judged(f, cell, rows)
    report.noise = noise
    saved_rows = _saved_rows(wall)
    saved = pd.Series(saved_rows).groupby(f["rank"].to_numpy()).sum()
    per_rank["saved_us"] = saved.reindex(per_rank.index, fill_value=0.0)
    per_rank["wall_slowdown"] = _wall_slowdown(wall, per_rank) if times.less_core_wait else per_rank["slowdown"]
    own_spike = _own_spikes(f, per_rank, noise)
    spiked = own_spike.nonzero()[0]
    spike_rank = f["rank"].to_numpy()[spiked]
    per_rank["own_spikes"] = pd.Series(1, index=spike_rank).groupby(level=0).sum().reindex(per_rank.index).fillna(0)
    per_rank["spike_saved_us"] = (
        pd.Series(saved_rows[spiked], index=spike_rank).groupby(level=0).sum().reindex(per_rank.index).fillna(0.0)
    )
    n_steps = report.steps
    step_time_us = grid.per_step(f, "iteration_us", "max")
    total_time_us = float(step_time_us.sum())
    persistent = per_rank[
        (per_rank["slow_fraction"] >= PERSISTENT_FRACTION)
        & (per_rank["slow_steps"] >= MIN_PERSISTENT_STEPS)
        & (per_rank["slowdown"] >= SLOWDOWN_MIN)
        & (per_rank["noise_z"] >= NAMED_Z)
        & (per_rank["wall_slowdown"] >= WAITED_FOR_MIN)
    ]
    if times.less_core_wait and len(persistent):  # judged on wall-clock busy time too: the others' wait
        _, waited, _ = _judged(wall[["rank", "step", "peers", "busy_us"]], cell, rows)
        persistent = persistent.assign(waited_z=waited["noise_z"].reindex(persistent.index).to_numpy())
    transient = per_rank[
        (per_rank["own_spikes"] > 0)
        & ~per_rank.index.isin(persistent.index)
        & (per_rank["spike_saved_us"] >= TRANSIENT_MIN_LOST_FRACTION * total_time_us)
    ].nlargest(MAX_TRANSIENT, "spike_saved_us")
    persistent_ranks = set(persistent.index)
    for rank, row in pd.concat([persistent, transient]).iterrows():
        is_persistent = rank in persistent_ranks
        mine = f[(f["rank"] == rank) & (f["slow"] if is_persistent else f["spike"])]
        excess_data = float((mine["data_wait_us"] - mine["others_data_us"]).median())
        excess_compute = float((mine["compute_us"] - mine["others_compute_us"]).median())
        info = ranks_info.loc[rank] if rank in ranks_info.index else None
        spike_steps = [] if is_persistent else sorted(f["step"].to_numpy()[spiked[spike_rank == rank]].tolist())
        straggler = Straggler(
            rank=int(rank),
            host=_get(info, "host"),
            local_rank=_get_int(info, "local_rank"),
            gpu=_get_int(info, "gpu_index"),
            slowdown=float(row["slowdown"]),
            steps_slow_fraction=float(row["slow_fraction"]),
            persistent=is_persistent,
            cause=Cause.UNKNOWN,
            time_saved_per_step_s=float(row["saved_us"]) / n_steps / 1e6,
            time_lost_s=float(row["saved_us"]) / 1e6,
            excess_data_wait_ms=excess_data / 1e3,
            excess_compute_ms=excess_compute / 1e3,
            last_arrival_fraction=last_arrival.get(int(rank)),
            cost_per_step_s=0.0 if is_persistent else float(row["spike_saved_us"]) / n_steps / 1e6,
            noise_z=_finite(row["noise_z"]) if is_persistent else None,
            wall_slowdown=float(row["wall_slowdown"]) if is_persistent and times.less_core_wait else None,
            waited_z=_finite(row["waited_z"]) if is_persistent and times.less_core_wait else None,
            spike_steps=[int(s) for s in spike_steps],
        )
        straggler.confidence = _confidence(straggler, n_steps)
        report.stragglers.append(straggler)
    _assign_causes(report.stragglers, ranks_info, throttled, persistent_ranks, memory_pressure or {})
    _credit_costs(times, [s for s in report.stragglers if s.persistent], n_steps)
    for s in report.stragglers:
        s.evidence.append(cost_text(s))
        s.mesh = place(s.rank) if place is not None else None
        if s.mesh is not None:
            s.evidence.append(s.mesh.text())
    report.stragglers.sort(key=lambda s: (not s.persistent, -s.cost_per_step_s, -s.time_lost_s))
    own_spike_steps = {step for s in report.stragglers for step in s.spike_steps}
    # one rank per stage: the step time is the pipeline's, which no comparison of the stages explains
    report.jitter = None if one_rank_per_stage else _jitter(wall, step_time_us, own_spike_steps, n_steps)
    return report


def _slowdown(busy_median_us: np.ndarray, others_busy_us: np.ndarray) -> np.ndarray:
    """Each rank's median busy time over the other ranks' median, less 1 (0 where the others' is unknown)."""
    others = np.where(others_busy_us > 0, others_busy_us, np.nan)
    return np.nan_to_num(busy_median_us / others - 1, nan=0.0)


def _judged(f: pd.DataFrame, cell: np.ndarray, rows: np.ndarray | None) -> tuple[pd.DataFrame, pd.DataFrame, StepNoise]:
    """Each rank's busy time (``f.busy_us``) against the other ranks' and the run's noise (the module's doc).
    Returns ``f`` with each row's comparison (others_busy_us, excess_fraction, slow, spike), the per-rank table
    (``_per_rank`` with slowdown and noise_z) and the run's noise."""
    f = f.assign(others_busy_us=others_median(f["busy_us"].to_numpy(dtype="float64"), cell, rows))
    excess = f["busy_us"] - f["others_busy_us"]
    typical_us = _typical_busy_us(f)
    with np.errstate(divide="ignore", invalid="ignore"):
        f["excess_fraction"] = np.where(typical_us > 0, excess.to_numpy(dtype="float64") / typical_us, np.nan)
    f["slow"] = excess > SLOW_FRACTION * f["others_busy_us"]
    noise, step_spread = _step_noise(f)
    f["spike"] = f["excess_fraction"] > noise.spike_threshold
    per_rank = _per_rank(f)
    others_busy = others_median(per_rank["busy_median_us"].to_numpy(dtype="float64"), per_rank["peers"].to_numpy())
    per_rank["slowdown"] = _slowdown(per_rank["busy_median_us"].to_numpy(), others_busy)
    noise.rank_spread = _rank_spread(per_rank["slowdown"].to_numpy())
    per_rank["noise_z"] = _noise_z(per_rank, step_spread.reindex(per_rank.index), noise)
    return f, per_rank, noise


def _wall_slowdown(wall: pd.DataFrame, per_rank: pd.DataFrame) -> np.ndarray:
    """Each rank's slowdown in wall-clock busy time, the time the other ranks wait for. A rank whose work is
    over the others' but whose wall time is not (it got more of a core than they did, on a loaded host, and
    waits as long as they do) holds nobody up."""
    busy = grid.per_rank(wall, "busy_us").reindex(per_rank.index).to_numpy(dtype="float64")
    return _slowdown(busy, others_median(busy, per_rank["peers"].to_numpy()))


def _across_stages(times: RankStepTimes, stage_work_us: pd.Series | None) -> RankStepTimes | None:
    """A pipeline with one rank per stage, made comparable across stages: each rank's busy time is its data
    wait (the loaders do the same work whatever their stages compute) plus its compute work moved to a common
    level (its work in the step, less its own median, plus the median over ranks of theirs), so that a stage
    that always computes longer is not a straggler (the bubble analysis's imbalance) while a step in which one
    stage computed far longer than usual is that stage's own spike. Without pipeline work rows, data waits
    alone, among the ranks that wait for data (a middle stage fed by its neighbours waits 0); None when fewer
    than two ranks are left to compare."""
    frame = times.frame
    if stage_work_us is not None and len(stage_work_us):
        work = pd.Series(
            stage_work_us.reindex(pd.MultiIndex.from_arrays([frame["rank"], frame["step"]])).to_numpy(),
            index=frame.index,
        )
        usual = work.groupby(frame["rank"]).transform("median")
        common = float(work.groupby(frame["rank"]).median().median())
        compute = (work - usual).fillna(0.0) + common
        frame = frame[frame["rank"].isin(stage_work_us.index.get_level_values(0))].copy()
        frame["compute_us"] = compute.reindex(frame.index).clip(lower=0).to_numpy()
    else:
        waits = frame.groupby("rank")["data_wait_us"].median()
        frame = frame[frame["rank"].isin(waits.index[waits > 0])].copy()
        frame["compute_us"] = 0.0
    if frame["rank"].nunique() < 2:
        return None
    frame["busy_us"] = frame["data_wait_us"].astype("float64") + frame["compute_us"]
    frame["work_us"] = frame["busy_us"]  # the stages' work already leaves their actions' waits for a core out
    frame["peers"] = np.zeros(len(frame), dtype="int64")
    return RankStepTimes(frame.reset_index(drop=True), times.wait_source, times.less_core_wait)


def _typical_busy_us(f: pd.DataFrame) -> np.ndarray | float:
    """The run's typical busy time (the median over its peers' rows), the unit of a rank's excess: a step's own
    median would make a spike of the rank whose peers happened to be quick in that step."""
    if _rank_major(f) is not None:
        busy = f["busy_us"].to_numpy(dtype="float64")
        return float(np.nanmedian(busy)) if np.isfinite(busy).any() else np.nan
    return f.groupby("peers")["busy_us"].transform("median").to_numpy(dtype="float64")


def _step_noise(f: pd.DataFrame) -> tuple[StepNoise, pd.Series]:
    """The run's step spread (the median over ranks of each rank's robust sigma of its excess from step to step)
    and the spike threshold it gives, with each rank's own step spread."""
    f["_median_excess"] = _per_row(f, grid.per_rank(f, "excess_fraction"))
    f["_excess_deviation"] = (f["excess_fraction"] - f["_median_excess"]).abs()
    per_rank_spread = SPREAD_PER_MAD * grid.per_rank(f, "_excess_deviation")
    f.drop(columns=["_median_excess", "_excess_deviation"], inplace=True)
    step_spread = float(np.nan_to_num(np.nanmedian(per_rank_spread.to_numpy())) if len(per_rank_spread) else 0.0)
    noise = StepNoise(step_spread=step_spread, spike_threshold=max(SPIKE_FRACTION, SPIKE_Z * step_spread))
    return noise, per_rank_spread


def _rank_spread(slowdowns: np.ndarray) -> float:
    """Robust sigma of the slowdowns of the ranks that cannot be stragglers (under ``SLOWDOWN_MIN``), so that
    stragglers, however many, do not widen it; 0 with fewer than 3 ranks (with 2, each is the other's mirror)
    or fewer than 2 such ranks."""
    slowdowns = slowdowns[np.isfinite(slowdowns)]
    healthy = slowdowns[slowdowns < SLOWDOWN_MIN]
    if len(slowdowns) < 3 or len(healthy) < 2:
        return 0.0
    return float(SPREAD_PER_MAD * np.median(np.abs(healthy - np.median(healthy))))


def _noise_z(per_rank: pd.DataFrame, step_spread: pd.Series, noise: StepNoise) -> np.ndarray:
    """Each rank's evidence in sigmas of its noise, the stronger of two: its slowdown over the standard error of
    its median excess (its own step spread, at least the run's, over its steps, counted as at most
    ``MAX_INDEPENDENT_STEPS`` samples: a busy neighbour slows a rank for a stretch of steps, not one step at a
    time) and the rank spread, added in quadrature; and how much more often it is slow than the usual rank
    (a sign test on as many samples), which a few extreme steps cannot sway."""
    spread = np.maximum(np.nan_to_num(step_spread.to_numpy(dtype="float64")), noise.step_spread)
    steps = np.clip(per_rank["steps"].to_numpy(dtype="float64"), 1, MAX_INDEPENDENT_STEPS)
    sigma = np.hypot(MEDIAN_STANDARD_ERROR * spread / np.sqrt(steps), noise.rank_spread)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_median = np.where(sigma > 0, per_rank["slowdown"].to_numpy() / sigma, np.inf)
    # how often it is slow, against how often any rank is (a sign test, on as many independent samples)
    usual = float(np.clip(np.nanmedian(per_rank["slow_fraction"].to_numpy(dtype="float64")), 0.05, 0.95))
    slow = per_rank["slow_fraction"].to_numpy(dtype="float64") * steps
    by_count = (slow - steps * usual) / np.sqrt(steps * usual * (1 - usual))
    return np.maximum(by_median, by_count)


def _own_spikes(f: pd.DataFrame, per_rank: pd.DataFrame, noise: StepNoise) -> np.ndarray:
    """Per row: a spike of its rank's own, above the spike threshold and ``OWN_SPIKE_RATIO`` times the largest
    excess the other ranks (of its peers) show: the ``OTHERS_LARGEST_QUANTILE`` quantile of each one's largest."""
    largest = grid.per_rank(f, "excess_fraction", "max").reindex(per_rank.index).to_numpy(dtype="float64")
    others = others_quantile(np.nan_to_num(largest, nan=0.0), per_rank["peers"].to_numpy(), OTHERS_LARGEST_QUANTILE)
    bar = np.maximum(noise.spike_threshold, OWN_SPIKE_RATIO * np.nan_to_num(others, nan=0.0))
    return (f["excess_fraction"].to_numpy() > _per_row(f, pd.Series(bar, index=per_rank.index))) & f["spike"].to_numpy()


def others_quantile(values: np.ndarray, groups: np.ndarray, q: float) -> np.ndarray:
    """For each element, the ``q`` quantile (linear, as ``np.quantile``) of the *other* elements of its group
    (NaN when it is alone): from each group sorted once, the k-th of the others being the k-th sorted value
    below the element's own position, else the (k+1)-th."""
    values = np.asarray(values, dtype="float64")
    out = np.full(len(values), np.nan)
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        n_others = len(members) - 1
        if n_others < 1:
            continue
        order = np.argsort(values[members], kind="stable")
        ordered = values[members][order]
        position = np.empty(len(members), dtype="int64")
        position[order] = np.arange(len(members))
        h = q * (n_others - 1)
        low, fraction = int(np.floor(h)), h - np.floor(h)
        high = min(low + 1, n_others - 1)
        lower, upper = (ordered[np.where(k < position, k, k + 1)] for k in (low, high))
        out[members] = lower + fraction * (upper - lower)
    return out


def _per_row(f: pd.DataFrame, per_rank: pd.Series) -> np.ndarray:
    """A per-rank value at each row: repeated rank by rank in the usual layout, else mapped."""
    layout = _rank_major(f)
    if layout is None:
        return f["rank"].map(per_rank).to_numpy(dtype="float64")
    heads = f["rank"].to_numpy()[:: len(layout[1])]
    return np.repeat(per_rank.reindex(heads).to_numpy(dtype="float64"), len(layout[1]))


def _confidence(s: Straggler, steps: int) -> str:
    """The most severe grade the evidence allows: enough steps, and an effect far enough above the noise (a
    persistent straggler: its work, and the others' wait for it, ``WAITED_Z``) or enough own spikes (a transient
    one). On a loaded host a rank's thread can spend a stretch of the run on a core it shares with other work:
    its time on the core grows (cold caches, preemptions) while the others hardly wait, which is the host's
    doing; a rank that does more work holds the others up by more than the noise of their wait."""
    waited = s.waited_z is None or s.waited_z >= WAITED_Z  # None: judged on wall time already, or no noise
    for grade in ("high", "medium"):
        enough = (
            (s.noise_z or 0.0) >= Z_FOR[grade] and waited if s.persistent else len(s.spike_steps) >= SPIKES_FOR[grade]
        )
        if steps >= STEPS_FOR[grade] and enough:
            return grade
    return "low"


def _finite(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _credit_costs(times: RankStepTimes, persistent: list[Straggler], steps: int) -> None:
    """Each persistent straggler's cost to the job, credited in the waterfall of the findings (causes worst
    first, then ranks worst first): what fixing it adds once the worse ones are fixed. Where fixing it alone
    saves less than that, the worst straggler before it is what still sets the step."""
    if not persistent or not steps:
        return
    for rank_cost, s in zip(waterfall_us(times, waterfall_order(persistent)), waterfall_order(persistent)):
        s.cost_per_step_s = rank_cost / steps / 1e6
    order = waterfall_order(persistent)
    for i, s in enumerate(order):
        worse = order[:i]
        if worse and s.time_saved_per_step_s < 0.5 * s.cost_per_step_s:
            s.slower_rank = max(worse, key=lambda w: w.slowdown).rank


def cost_text(s: Straggler) -> str:
    """The straggler's two costs, said plainly: what the job loses to it, and what fixing it alone saves."""
    cost = f"costs the job {s.cost_per_step_s * 1e3:.1f} ms/step"
    if not s.persistent:
        return f"{cost} in its spikes"
    alone = f"fixing it alone saves {s.time_saved_per_step_s * 1e3:.1f} ms/step"
    if s.slower_rank is not None:
        return f"{cost}; {alone} while rank {s.slower_rank} is slower"
    return f"{cost}; {alone}"


def waterfall_order(persistent: list[Straggler]) -> list[Straggler]:
    """Causes worst first (by their worst rank's slowdown), each cause's ranks worst first."""
    worst = {}
    for s in persistent:
        worst[s.cause] = max(worst.get(s.cause, -np.inf), s.slowdown)
    causes = sorted(worst, key=lambda c: -worst[c])
    return sorted(persistent, key=lambda s: (causes.index(s.cause), -s.slowdown, s.rank))


def waterfall_us(times: RankStepTimes, order: list[Straggler]) -> list[float]:
    """What fixing each straggler adds once the ones before it are fixed (joint savings' differences)."""
    fixed: list[int] = []
    before_us, out = 0.0, []
    for s in order:
        fixed.append(s.rank)
        after_us = joint_saving_us(times, fixed)
        out.append(after_us - before_us)
        before_us = after_us
    return out


def _jitter(f: pd.DataFrame, step_time_us: pd.Series, own_spike_steps: set, steps: int) -> Jitter | None:
    """Steps over ``SPIKE_FRACTION`` slower than the median step that no straggler's own spike explains, with
    what they cost (their time above the median step) and who was busiest in them; None without any, or when
    they cost under ``TRANSIENT_MIN_LOST_FRACTION`` of the run."""
    if not len(step_time_us) or not steps:
        return None
    median_us = float(step_time_us.median())
    slow = step_time_us[(step_time_us > (1 + SPIKE_FRACTION) * median_us) & ~step_time_us.index.isin(own_spike_steps)]
    lost_us = float((slow - median_us).sum())
    if not len(slow) or lost_us < TRANSIENT_MIN_LOST_FRACTION * float(step_time_us.sum()):
        return None
    busiest = grid.rank_of_step_max(f, "busy_us").reindex(slow.index).dropna().astype(int).value_counts()
    return Jitter(
        steps=[int(s) for s in slow.index],
        median_step_s=median_us / 1e6,
        time_lost_s=lost_us / 1e6,
        time_lost_per_step_s=lost_us / steps / 1e6,
        busiest_ranks=[(int(r), int(n)) for r, n in busiest.items()],
    )


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
            steps=("excess_fraction", "count"),
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
            "steps": np.isfinite(f["excess_fraction"].to_numpy()).reshape(ranks, len(steps))[order].sum(axis=1),
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
    """Per rank, summed over steps: what the step would shrink if that rank alone worked like the others."""
    return pd.Series(_saved_rows(f)).groupby(f["rank"].to_numpy()).sum()


def _saved_per_rank_step_by_cell(f: pd.DataFrame) -> pd.Series:
    """``_saved_per_rank_step`` from ``_saved_rows_by_cell`` (the large-trace path), whatever the frame's size."""
    return pd.Series(_saved_rows_by_cell(f)).groupby(f["rank"].to_numpy()).sum()


def _saved_rows(f: pd.DataFrame) -> np.ndarray:
    """Per row: what its step would shrink if its rank alone worked like the others (0 but for the step's
    busiest rank).

    Only the busiest rank of a step can shorten it, and only down to the next busiest: that rank's busy time
    is at least the others' median, which is what the busiest would come down to."""
    busy = f["busy_us"].to_numpy(dtype="float64")
    if len(busy) >= 1 << 16 and not np.isnan(busy).any():
        return _saved_rows_by_cell(f)
    step, peers = f["step"].to_numpy(), f["peers"].to_numpy()
    order = np.lexsort((-busy, step, peers))
    busy, step, peers = busy[order], step[order], peers[order]
    new_cell = np.r_[True, (step[1:] != step[:-1]) | (peers[1:] != peers[:-1])]
    top = np.flatnonzero(new_cell)  # the busiest rank of each step (among its peers)
    nxt = np.minimum(top + 1, len(step) - 1)
    has_second = (top + 1 < len(step)) & ~new_cell[nxt]
    out = np.zeros(len(busy))
    out[order[top]] = np.nan_to_num(np.where(has_second, np.clip(busy[top] - busy[nxt], 0, None), 0.0))
    return out


def _saved_rows_by_cell(f: pd.DataFrame) -> np.ndarray:
    """``_saved_rows`` without sorting the rows (its lexsort of 16 M rank-steps was ~7 s at 16,384 ranks):
    each step's busiest and second busiest by a maximum per cell. The same values: the busiest is the first row
    (in the frame's order) at the cell's maximum, as the stable lexsort puts it. No NaN busy time (the caller
    checks)."""
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
    out = np.zeros(len(busy))
    out[top] = np.where(has_second, np.clip(first - second, 0, None), 0.0)
    return out


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
        if s.persistent:
            noise = f" ({s.noise_z:.0f}x its noise)" if s.noise_z is not None else ""
            s.evidence.append(
                f"slow in {100 * s.steps_slow_fraction:.0f}% of the steps; median work {100 * s.slowdown:+.0f}% vs the other ranks{noise}"
            )
            if s.waited_z is not None:
                s.evidence.append(
                    f"the others wait for it: its wall-clock busy time {100 * s.wall_slowdown:+.0f}% over theirs "
                    f"({s.waited_z:.1f}x their noise)"
                )
        else:
            s.evidence.append(
                f"spikes of its own in {len(s.spike_steps)} step(s): {_steps_text(s.spike_steps)}; median work "
                f"{100 * s.slowdown:+.0f}% vs the other ranks"
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
    """One finding per cause among persistent stragglers, one for all transient ones, one for the job's jitter.

    Only the slowest rank of a step sets its length, so fixing one straggler helps only down to the next one.
    Causes are credited in a waterfall, worst first (``_credit_costs``): each gets what fixing it saves once the
    worse ones are fixed, and the credits add up to what fixing them all would save. A finding's severity is
    its cost's, capped by the confidence of its best-evidenced rank."""
    step_s = ctx.step_s
    out = []
    order = waterfall_order([s for s in report.stragglers if s.persistent])
    causes = list(dict.fromkeys(s.cause for s in order))
    all_s = sum(s.cost_per_step_s for s in order)
    for cause in causes:
        group = [s for s in order if s.cause == cause]
        finding = _straggler_finding("straggler", group, report.steps, step_s, cause)
        if len(causes) > 1:
            finding.evidence.append(
                f"fixing every persistent straggler would save {all_s * 1e3:.1f} ms/step; this one is credited what it adds once the slower ones are fixed"
            )
        out.append(finding)
    transient = [s for s in report.stragglers if not s.persistent]
    if transient:
        out.append(_straggler_finding("transient_straggler", transient, report.steps, step_s, None))
    if report.jitter is not None:
        out.append(_jitter_finding(report.jitter, report.steps, step_s))
    return out


def _extra_work_text(s: Straggler) -> str:
    """'+45% work'; in milliseconds where the others' work is next to nothing (a pipeline's ranks compared on
    their data waits alone: +595781% said nothing)."""
    if s.slowdown < LARGE_SLOWDOWN:
        return f"{100 * s.slowdown:+.0f}% work"
    return f"{s.excess_data_wait_ms + s.excess_compute_ms:+.1f} ms work a step"


def _straggler_finding(kind, group: list[Straggler], steps: int, step_s, cause) -> Finding:
    ranks = [s.rank for s in group]
    per_step = sum(s.cost_per_step_s for s in group)
    who = ranks_text(ranks)
    if len(group) == 1 and group[0].mesh is not None:
        who += f" ({group[0].mesh.where})"
    if kind == "straggler":
        worst = max(group, key=lambda s: s.slowdown)
        title = (
            f"{who[0].upper()}{who[1:]} {'is a' if len(ranks) == 1 else 'are'} persistent straggler{'s' * (len(ranks) > 1)} ({cause}): "
            f"{_extra_work_text(worst)}, costs the job {per_step * 1e3:.1f} ms/step"
        )
        advice = Cause(cause).advice
    else:
        title = f"Occasional slow steps on {who} (transient spikes) cost {per_step * 1e3:.1f} ms/step on average"
        advice = "One-off slow steps: look for garbage collection (gc.freeze / gc.disable in the loop), checkpointing or logging on these ranks at those steps."
    evidence = [f"rank {s.rank}: {e}" for s in group[:5] for e in s.evidence]
    confidence = min((s.confidence for s in group), key=SEVERITY_ORDER.get)
    return Finding(
        kind=kind,
        severity=_capped(severity_for(per_step, step_s), confidence),
        title=title,
        ranks=ranks,
        time_lost_s=per_step * steps,
        time_lost_per_step_s=per_step,
        evidence=evidence,
        advice=advice,
        hosts=sorted({s.host for s in group if s.host}),
        gpus=[f"{s.host}:{s.gpu}" for s in group if s.gpu is not None],
    )


def _jitter_finding(jitter: Jitter, steps: int, step_s) -> Finding:
    """Low unless a few steps (``JITTER_HICCUP_FRACTION`` of them at most: a periodic hiccup such as a
    checkpoint or a collection on every rank, which the job can fix) cost ``JITTER_MEDIUM_SHARE`` of the step
    over enough steps. Slow steps by the dozen are the host's noise (other work, a busy neighbour): worth
    knowing, and the job cannot fix it."""
    per_step = jitter.time_lost_per_step_s
    share = per_step / step_s if step_s else 0.0
    hiccups = len(jitter.steps) <= JITTER_HICCUP_FRACTION * steps
    severity = "medium" if share >= JITTER_MEDIUM_SHARE and steps >= STEPS_FOR["high"] and hiccups else "low"
    busiest = ", ".join(f"rank {r} in {n}" for r, n in jitter.busiest_ranks[:6])
    return Finding(
        kind="jitter",
        severity=severity,
        title=(
            f"Step time jitter: {len(jitter.steps)} of {steps} steps over {100 * (1 + SPIKE_FRACTION):.0f}% of the "
            f"median step, no one rank behind them, cost {per_step * 1e3:.1f} ms/step on average"
        ),
        ranks=[],
        time_lost_s=jitter.time_lost_s,
        time_lost_per_step_s=per_step,
        evidence=[
            f"slow steps: {_steps_text(jitter.steps)} (median step {jitter.median_step_s * 1e3:.1f} ms)",
            f"the busiest rank in those steps: {busiest}"
            + (": the slowdown moves between ranks, as a host's noise does" if len(jitter.busiest_ranks) > 1 else ""),
            f"no rank's spikes stand out: none is {OWN_SPIKE_RATIO:.0f}x the largest the other ranks show",
        ],
        advice=(
            "Job-wide jitter, not a straggler: look for other work on the hosts (CPU contention, noisy neighbours), "
            "garbage collection on every rank (gc.freeze / gc.disable in the loop), periodic logging or "
            "checkpointing, and OS jitter (pin the ranks' CPU cores)."
        ),
    )


def _capped(severity: str, confidence: str) -> str:
    return max(severity, confidence, key=SEVERITY_ORDER.get)


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:MAX_LISTED_STEPS]))
    return shown + (f" and {len(steps) - MAX_LISTED_STEPS} more" if len(steps) > MAX_LISTED_STEPS else "")


def _stragglers_json(report: StragglerReport) -> dict:
    return {
        "stragglers": [_without_absent_mesh(s) for s in json_safe(report.stragglers)],
        "straggler_method": {
            "wait_source": report.wait_source,
            "steps": report.steps,
            "note": report.note,
            "compared": report.compared,
            "noise": json_safe(report.noise),
            **({"less_core_wait": True} if report.less_core_wait else {}),
        },
        "jitter": json_safe(report.jitter),
    }


def _without_absent_mesh(straggler: dict) -> dict:
    """A straggler's ``mesh`` only on a run with a device mesh: the JSON of other runs is what it was."""
    if straggler.get("mesh") is None:
        straggler.pop("mesh", None)
    return straggler


SECTION = Section("stragglers", straggler_findings, json=_stragglers_json)
