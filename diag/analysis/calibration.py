"""How fast the machine ran for a run, from its ``calibration`` rows (diag/capture/calibration.py), and the
correction that separates "this machine ran slower" from "this job got slower" in ``diag compare``.

Pure functions (no torch). Each rank writes a calibration row at init, every ``calibrate_every`` steps and at
finish; the k-th rows of the ranks are one *round*, and the steps between two rounds are an *interval*.

**Machine slowness** of an interval (``factor``, 1 = the job had its cores to itself; larger is slower):

* ``runqueue`` (CPU, Linux): the time the ranks' threads ran plus the time they were ready to run but waited
  for a core, over the time they ran: how much longer their runnable work took than on cores of their own. It
  is measured over the whole interval, not sampled, so load that came and went between rounds counts. On a
  shared 2-core machine, over 10-step intervals of a 3-rank gloo job with and without a CPU burner, it went with
  the interval's median step time at a correlation of 0.80-0.88 (log-log, each run's mean taken out; slope
  0.88-0.94), where the fixed matmul's time went at 0.31-0.45 (slope 0.17-0.21): a millisecond or two of matmul
  sees other load only when a time slice happens to fall in it (docs/compare.md).
* ``kernel`` (CUDA, or where schedstat is missing): the fixed workload's mean time, median over ranks, the mean
  of the two rounds around the interval (a GPU's clock and power state change its kernels' time).

**Correction** (``corrected_steps``): each step's time is scaled to the base run's machine,
``step x (base factor / interval factor) ^ s``. ``s``, the share of the step that goes with the machine's
speed, is estimated from the runs themselves where the load varied within them (the slope of the log of each
interval's median step time on the log of its factor, each run's own mean taken out, over at least
``MIN_INTERVALS_FOR_SLOPE`` intervals: a job that sleeps or waits on I/O for part of its step slows less than
the calibration), clipped to [0, 1]; else it is, on CPU, the share of the step the training thread ran or waited
for a core (its sleeps and I/O do not follow the cores' speed; 1 where the steps did not record it) and, on CUDA,
the GPU-busy share of the step (host time does not change with the GPU's clock). Runs without calibration rows
are compared as measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_STEPS_PER_INTERVAL = 3  # an interval with fewer steps in the window does not count for the slope
MIN_INTERVALS_FOR_SLOPE = 6  # over both runs
MIN_FACTOR_SPREAD = 0.05  # the within-run std of log(factor) below which the slope is not estimated
MAX_SLOPE_SE = 0.25  # a slope less certain than this falls back to the prior
# How far the true share may be from the prior (one standard deviation): 0.5, as far as a share within [0, 1]
# can be. The prior is the training thread's share of the step, and the step's other threads (gloo's, a data
# loader's) and its wake-ups after sleeping follow the cores too. Fitted to 60 same-job pairs of the fault
# suite (A/A, seeds 2965-2967: the steady step's change less the prior's correction, against the log of the
# factors' ratio), the error was 0.42 by maximum likelihood, 0.52 with the run-to-run noise held at 8.7% a run.
PRIOR_SENSITIVITY_SD = 0.5
MAX_INTERVALS_LISTED = 500


@dataclass
class MachineSpeed:
    """One run's machine speed from its calibration rows (the ``machine`` key of the report's run section)."""

    source: str  # runqueue (CPU, schedstat) or kernel (the fixed workload's time)
    device: str  # cpu or cuda
    factor: float  # the run's slowness: runqueue (cpu + wait) / cpu over all intervals; kernel: median time (us)
    rounds: int
    samples: int  # rows (ranks x rounds)
    runqueue_wait_pct: float | None = None  # of the ranks' runnable time, spent waiting for a core
    kernel_us: float | None = None  # the fixed workload's mean time, median over rows after init
    kernel_min_us: float | None = None  # its fastest repetition, median over rows after init
    threads: int | None = None
    sm_clock_mhz: float | None = None  # CUDA: median over rows
    sm_clock_max_mhz: float | None = None
    pstate: int | None = None  # CUDA: the most common performance state
    throttled_share: float | None = None  # CUDA: rows with a clock-event reason other than idle
    # intervals of steps: {first_step, last_step, factor}, in order
    intervals: list[dict] = field(default_factory=list)

    def factor_of_steps(self, steps: np.ndarray) -> np.ndarray:
        """Each step's interval factor (the run's factor for steps outside every interval)."""
        out = np.full(len(steps), self.factor, dtype="float64")
        for interval in self.intervals:
            inside = (steps >= interval["first_step"]) & (steps <= interval["last_step"])
            out[inside] = interval["factor"]
        return out


def machine_speed(calibration: pd.DataFrame) -> MachineSpeed | None:
    """The run's machine speed, or None without calibration rows."""
    if calibration is None or calibration.empty:
        return None
    frame = calibration.sort_values(["rank", "time_us"], kind="stable").copy()
    frame["round"] = frame.groupby("rank").cumcount()
    for column in ("duration_us", "min_duration_us", "interval_cpu_us", "interval_runqueue_wait_us"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    rounds = frame.groupby("round").agg(
        step=("step", "median"),
        kernel_us=("duration_us", "median"),
        cpu_us=("interval_cpu_us", lambda v: v.sum(min_count=1)),
    )
    rounds["factor"] = _slowest_rank_factor(frame, "round")
    after_init = frame[frame["round"] > 0]
    device = str(frame["device"].mode().iloc[0]) if frame["device"].notna().any() else "cpu"
    speed = MachineSpeed(
        source="kernel",
        device=device,
        factor=float("nan"),
        rounds=len(rounds),
        samples=len(frame),
        kernel_us=_median(after_init["duration_us"]) if len(after_init) else _median(frame["duration_us"]),
        kernel_min_us=_median(after_init["min_duration_us"]) if len(after_init) else None,
        threads=int(frame["threads"].median()) if frame["threads"].notna().any() else None,
    )
    _gpu_clocks(speed, frame)
    intervals = []
    previous_step = -1
    for round_index, row in rounds.iterrows():
        last = int(round(row["step"]))
        if round_index > 0 and last > previous_step:
            intervals.append({"first_step": previous_step + 1, "last_step": last, "row": row})
        previous_step = max(previous_step, last)
    cpu = sum(i["row"]["cpu_us"] for i in intervals if _finite(i["row"]["cpu_us"]))
    if device == "cpu" and cpu > 0 and all(_finite(i["row"]["cpu_us"]) for i in intervals):
        speed.source = "runqueue"
        in_intervals = frame[frame["round"].isin([i["row"].name for i in intervals])].assign(run=0)
        speed.factor = float(_slowest_rank_factor(in_intervals, "run").iloc[0])
        speed.runqueue_wait_pct = float(100 * (1 - 1 / speed.factor))
        factors = [float(i["row"]["factor"]) for i in intervals]
    else:
        kernel = rounds["kernel_us"].to_numpy(dtype="float64")
        speed.factor = float(np.nanmedian(kernel[1:] if len(kernel) > 1 else kernel))
        # a snapshot at each end of the interval: their mean (rounds are numbered 0.. in order)
        factors = [float(np.nanmean([kernel[rounds.index.get_loc(i["row"].name) - 1], i["row"]["kernel_us"]]))
                   for i in intervals]  # fmt: skip
    if not _finite(speed.factor) or speed.factor <= 0:
        return None
    speed.intervals = [
        {"first_step": i["first_step"], "last_step": i["last_step"], "factor": f if _finite(f) and f > 0 else None}
        for i, f in zip(intervals, factors, strict=True)
    ][:MAX_INTERVALS_LISTED]
    speed.intervals = [i for i in speed.intervals if i["factor"] is not None]
    return speed


def _slowest_rank_factor(frame: pd.DataFrame, by: str) -> pd.Series:
    """Per group of rows (``by``): the slowest rank's (cpu + run-queue wait) / cpu over the group's intervals.
    The ranks of a synchronous job wait for the slowest at every collective, so its step goes with the rank
    that waited most for a core, not with the ranks' mean: over 60 same-job pairs of the fault suite (A/A, seeds
    2965-2967), what is left of the log of the steady step's change once the prior share times the log of the
    factors' ratio is taken out had a standard deviation of 0.160 with the slowest rank's factor and 0.171 with
    the ranks' mean (0.194 uncorrected), and a largest value of 0.45 against 0.68."""
    sums = frame.groupby([by, "rank"])[["interval_cpu_us", "interval_runqueue_wait_us"]].sum(min_count=1)
    cpu, wait = sums["interval_cpu_us"], sums["interval_runqueue_wait_us"]
    factor = ((cpu + wait) / cpu).where(cpu > 0)
    return factor.groupby(level=by).max()


def _gpu_clocks(speed: MachineSpeed, frame: pd.DataFrame) -> None:
    clocks = pd.to_numeric(frame["sm_clock_mhz"], errors="coerce")
    if clocks.notna().any():
        speed.sm_clock_mhz = float(clocks.median())
        speed.sm_clock_max_mhz = _median(pd.to_numeric(frame["sm_clock_max_mhz"], errors="coerce"))
    pstates = pd.to_numeric(frame["pstate"], errors="coerce").dropna()
    if len(pstates):
        speed.pstate = int(pstates.mode().iloc[0])
    reasons = pd.to_numeric(frame["throttle_reasons"], errors="coerce").dropna().astype("int64")
    if len(reasons):
        speed.throttled_share = float(((reasons & ~0x1) != 0).mean())  # 0x1: idle, not a slowdown


def _median(values) -> float | None:
    values = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def _finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# -- the correction between two runs ---------------------------------------------------------------------------
@dataclass
class MachineComparison:
    """How the two runs' machines differed, and the correction applied to the new run's (and the base run's own
    varying) step times before the verdict (``StepTime.machine`` in docs/compare.md)."""

    source: str  # runqueue or kernel
    base_factor: float
    new_factor: float
    machine_change_pct: float  # the new run's machine against the base's: + slower, - faster
    sensitivity: float  # s: the share of the step that goes with the machine's speed
    sensitivity_source: str  # "estimated from N intervals" or the prior's reason
    sensitivity_sd: float = 0.0  # how uncertain s is: the slope's standard error, or PRIOR_SENSITIVITY_SD
    # what that uncertainty adds to the job's own change: one standard deviation, in %, in the noise floor
    correction_noise_pct: float = 0.0
    raw_steady_change_pct: float | None = None  # the steady step time's change as measured, before the correction
    raw_steady_ci_pct: list[float] | None = None
    own_change_pct: float | None = None  # the job's own change: the steady step time's after the correction
    own_ci_pct: list[float] | None = None
    statistic: str = ""  # what own_change_pct compares: the median of the intervals' levels, or the steady step time


def comparable(base: MachineSpeed | None, new: MachineSpeed | None) -> bool:
    return base is not None and new is not None and base.source == new.source and base.device == new.device


def sensitivity(
    runs: list[tuple[MachineSpeed, list[int], list[float]]], prior: float, prior_reason: str
) -> tuple[float, float, str]:
    """The share of the step that goes with the machine's speed, its standard deviation and where it came
    from: from the runs' intervals (each run's (speed, steps, step_ms)), else ``prior`` (give or take
    ``PRIOR_SENSITIVITY_SD``) when the load did not vary enough within the runs to tell."""
    fallback = prior, PRIOR_SENSITIVITY_SD, prior_reason
    xs, ys = [], []
    for speed, steps, step_ms in runs:
        steps_a, ms = np.asarray(steps), np.asarray(step_ms, dtype="float64")
        x, y = [], []
        for interval in speed.intervals:
            inside = (steps_a >= interval["first_step"]) & (steps_a <= interval["last_step"]) & np.isfinite(ms)
            if inside.sum() >= MIN_STEPS_PER_INTERVAL and np.median(ms[inside]) > 0:
                x.append(math.log(interval["factor"]))
                y.append(math.log(float(np.median(ms[inside]))))
        if len(x) >= 2:
            xs.append(np.asarray(x) - np.mean(x))
            ys.append(np.asarray(y) - np.mean(y))
    if not xs:
        return fallback
    x, y = np.concatenate(xs), np.concatenate(ys)
    n = len(x)
    if n < MIN_INTERVALS_FOR_SLOPE or float(np.std(x)) < MIN_FACTOR_SPREAD:
        return fallback
    sxx = float((x * x).sum())
    slope = float((x * y).sum() / sxx)
    residual = y - slope * x
    se = math.sqrt(float((residual**2).sum()) / max(n - 1 - len(xs), 1) / sxx)
    if se > MAX_SLOPE_SE:
        return fallback
    clipped = min(max(slope, 0.0), 1.0)
    return clipped, se, f"estimated from {n} intervals (slope {slope:.2f} +- {1.96 * se:.2f})"


def interval_levels(speed: MachineSpeed, steps: list[int], step_ms: list[float], reference: float, s: float):
    """Each interval's level at a machine of slowness ``reference``: the median of its steps in the window times
    (reference / its factor) ^ s; intervals with fewer than MIN_STEPS_PER_INTERVAL steps are left out. The
    median step of an interval goes with its factor (the lower decile, which a comparison reads without
    calibration, is of the steps that happened to miss the load, which a factor averaged over the interval does
    not describe)."""
    steps_a, ms = np.asarray(steps), np.asarray(step_ms, dtype="float64")
    levels = []
    for interval in speed.intervals:
        inside = (steps_a >= interval["first_step"]) & (steps_a <= interval["last_step"]) & np.isfinite(ms)
        if inside.sum() >= MIN_STEPS_PER_INTERVAL:
            levels.append(float(np.median(ms[inside])) * (reference / interval["factor"]) ** s)
    return np.asarray(levels, dtype="float64")


def levels_change(base: np.ndarray, new: np.ndarray, resamples: int, seed: int, confidence: float):
    """(change %, [low, high]) of the median level, the intervals resampled with replacement in each run."""
    b, n = float(np.median(base)), float(np.median(new))
    rng = np.random.default_rng(seed)
    rb = np.median(base[rng.integers(0, len(base), size=(resamples, len(base)))], axis=1)
    rn = np.median(new[rng.integers(0, len(new), size=(resamples, len(new)))], axis=1)
    diff = 100 * (rn / rb - 1)
    tail = 100 * (1 - confidence) / 2
    return 100 * (n / b - 1), [float(np.percentile(diff, tail)), float(np.percentile(diff, 100 - tail))]


def corrected_steps(speed: MachineSpeed, steps: list[int], step_ms: list[float], reference: float, s: float):
    """``step_ms`` scaled to a machine of slowness ``reference``: step x (reference / interval factor) ^ s."""
    factors = speed.factor_of_steps(np.asarray(steps))
    return np.asarray(step_ms, dtype="float64") * (reference / factors) ** s
