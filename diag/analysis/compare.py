"""Compare runs: what changed between two runs of a job (or more), where the time went, and how well it scales.

Pure functions over each run's ``Report`` and its steps table (no torch). ``summarize_run(trace, report)``
keeps what a comparison needs of one run (a ``RunSummary``, small enough to cache); ``compare_runs`` compares
every run with the first (the baseline) and, when world sizes differ, computes scaling efficiency.

**Step time** is the report's: per step, the iteration (data wait + step body) of the median rank, over the
window ``diag analyze`` chose (warm-up and incomplete steps left out).

**Verdict.** Other load on a machine (other jobs, a noisy neighbour, the OS) only ever adds time, to some steps
more than others: the same job run twice on a busy 2-core machine moved its median step by up to 29% here,
while its fastest steps stayed within a few percent. So the verdict is read from the *steady* step time, the
lower decile (``STEADY_QUANTILE``) of each run's per-step distribution, which a change in the job itself
(code, model, configuration) moves and outside interference barely does (over 16 pairs of the same job on
that machine the lower quartile still gave one false regression, the lower decile none, with narrower
intervals). Its change is bootstrapped (moving blocks of steps, so slow stretches stay together;
``RESAMPLES`` resamples, fixed seed): the verdict is "no change" when the 95% interval contains 0 or the change
is under the noise floor or ``THRESHOLD_PCT``, else "regression" or "improvement". The interval covers the
noise within each run's steps, not what differs between runs and is not the job; the **noise floor** holds
that: each run's level is off the job's by the run-to-run noise measured for its kind of machine
(``RUN_NOISE_PCT``: load that stays for a whole run, which no run shows by itself) or by its own drift when
larger (the robust standard deviation of its steady step time over ``DRIFT_WINDOWS`` consecutive windows: load
that came and went), and the floor is ``NOISE_Z`` times the two runs' added in quadrature. Measured with
benchmarks/bench_compare_noise.py (docs/benchmarks.md): false changes between sequential runs of one job on a
shared 2-core machine fell from 4 of 12 pairs to 1 and, on new runs, 0 of 12. A change the steps show under
the floor is "no change" with ``within_noise`` set. With repeats (``interleaved``: BASE NEW BASE NEW ...) the
verdict is the t interval of the pairs' changes instead (``repeats_change``): their spread measures the noise, and
a change is one whose whole interval lies beyond the threshold (``beyond_threshold``).
The median's change and interval are reported beside it, and a median that moved
while the steady time did not is called out (slower steps only: interference or intermittent stalls).

**Machine speed.** When both runs were calibrated (diag/capture/calibration.py: the training thread's run-queue
wait over each interval between calibrations on CPU, a fixed kernel's time on CUDA), each interval is put at the
base run's machine speed before the verdict (diag/analysis/calibration.py, ``machine_correction``); with at
least ``MIN_LEVELS`` intervals in each run the verdict reads the change of the intervals' median level, resampled
over the intervals, with ``CALIBRATED_RUN_NOISE_PCT`` in the floor. ``StepTime.machine`` says how much slower
the new run's machine was and the job's own change.

**Attribution.** Per step, the step time splits exactly into components, from the steps table and the
report's per-step series (``report.timeline.per_step``: iteration and busy time of the median and busiest
rank, with waits taken from collectives as the straggler analysis takes them):

* data wait: the median rank's (``steps.csv``);
* forward, backward, optimizer: the median rank's, less its communication wait where the wait sits in that
  phase (``wait_phase``: the phase whose time moves with the blocked time from rank to rank; DDP and FSDP
  wait for their gradient buckets at the end of the backward pass; a wait longer than its phase comes out of
  the rest of the body);
* rest of the step body: the median rank's busy time minus the above (user code, loss, ``zero_grad``);
* straggler loss: busiest rank's busy time minus the median rank's (everyone waits for the slowest);
* exposed communication: the step time minus the busiest rank's busy time (even the last rank to arrive
  waits), split over the collectives by (op, process group) in proportion to their transfer time (their
  bytes where durations are unknown, as for DDP buckets read from gloo's Flight Recorder);
* pipeline bubble (pipelined runs): the bubble report's idle per stage and step, taken out of the waits;
* torch.profiler (Kineto) runs: GPU compute, exposed communication, memory copies, other kernels and idle
  (the GPU time report, per step, mean over ranks), and the host time outside the GPU span.

Each component is averaged over the run's central steps (the 20% nearest the median step time, at least 5: their
mean stays near the median even when slow steps skew the distribution, and a checkpoint or GC spike does not
count); "unattributed" is what separates the sum of component changes from the change of the median step
time, so the rows add up to the headline change. Components also add up by group (data, compute,
communication, stragglers, pipeline bubble, GPU idle, host outside the GPU) for one-line answers.

**Scaling** (world sizes differ): throughput per GPU at the median step (tokens, else samples, per step over
all data-parallel replicas, else steps x ranks) against the smallest run; efficiency is their ratio (weak or
strong scaling read from the per-rank and global batch). The loss is the step time beyond the ideal one
(step time x efficiency) and is attributed to the components that grew beyond the baseline's, scaled to the
ideal step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.calibration import (
    MachineComparison,
    comparable,
    corrected_steps,
    interval_levels,
    levels_change,
    sensitivity,
)
from diag.analysis.compare_stability import compare_stability, losses, nonfinite_steps
from diag.analysis.report import Report, ranks_sharing_tokens
from diag.analysis.section import json_safe
from diag.analysis.window import select

RESAMPLES = 2000
SEED = 0
STEADY_QUANTILE = 0.10  # the verdict's statistic: the lower decile of per-step times
THRESHOLD_PCT = 2.0  # a change smaller than this is "no change" whatever its interval
DRIFT_WINDOWS = 6  # a run's steps split into this many consecutive windows for its own drift (noise_floor)
DRIFT_MIN_WINDOW_STEPS = 5  # ... of at least this many steps each; fewer than 3 windows: no drift estimate
DRIFT_QUANTILE = (
    STEADY_QUANTILE  # the level of a window: its steady (lower-decile) step time, as the verdict reads a run
)
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
NOISE_Z = 2.0  # the noise floor: this many standard deviations of the difference of two runs' levels
# Run-to-run noise: how far one run's steady step time sits from the job's own level, as a robust standard
# deviation in %, on the kinds of machine where it was measured with repeats of the same job
# (benchmarks/bench_compare_noise.py, docs/benchmarks.md). Load that stays for the whole of a run (another job,
# a busier neighbour) moves all of that run's windows alike, so no run can show it by itself (its drift), and
# two runs alone cannot tell it from a change of the job. Keyed by the runs' device; only CPU runs (gloo on
# shared cores) have been measured: elsewhere none is assumed, and --run-noise-pct or repeats (--interleaved)
# supply it. Measured as a robust standard deviation (8.7% for CPU runs: bench_compare_noise.py, 13 runs, 12
# consecutive pairs), which is blind by construction to the tails, and these are heavy (how much a run's threads
# are slowed on their cores, which no run-queue wait shows): over 60 same-job pairs run one after the other on a
# shared 2-core machine at no, 1x and 2x load (python -m diag.testing.faults --compare-pairs), the job's own change
# lay beyond the floor (NOISE_Z of it) in 6 pairs, where a normal distribution puts 2.7. So the default is that
# figure times TAILS_FACTOR, which left 2 of the 60 beyond the floor.
TAILS_FACTOR = 1.25
RUN_NOISE_PCT = {"cpu": round(8.7 * TAILS_FACTOR, 1)}
# The same after the machine-speed correction (both runs calibrated): what is left of a run's level off the job's
# once its intervals are put at the base run's machine speed. Measured on the shared 2-core machine at a load
# average of 13-34 (where the runs' median steps moved from 30 to 107 ms with no change of the job): the job's own
# change over 10 pairs of same-job 3-rank runs, with and without a CPU burner beside either, corrected by the
# ranks' mean factor, had a standard deviation of 17.5%, 12.4% a run (docs/compare.md, "Machine speed").
CALIBRATED_RUN_NOISE_PCT = {"cpu": 12.4}
# two-sided 95% quantiles of Student's t by degrees of freedom (the repeats' interval; 1.96 beyond the table)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip
MIN_REPEATS = 2  # --interleaved: at least this many pairs of runs
MIN_LEVELS = 4  # calibrated runs: at least this many calibration intervals in each for the verdict from them
CONFIDENCE = 0.95
CENTRAL_FRACTION = 0.2  # the attribution averages the middle 20% of the steps by step time ...
CENTRAL_MIN_STEPS = 5  # ... and at least this many
MIN_STEPS = 3  # fewer steps in either run: no verdict
MAX_BOOTSTRAP_CELLS = 4_000_000  # resampled step indices held at once (chunks of resamples beyond it)
SAME_BATCH_TOLERANCE = 0.05  # per-rank or global batches within 5% are "the same" (weak or strong scaling)

# component key -> label, in the order views list them when their changes tie
LABELS = {
    "data_wait": "data wait",
    "forward": "forward",
    "backward": "backward (compute)",
    "optimizer": "optimizer",
    "step_rest": "rest of the step body",
    "straggler": "straggler loss (waiting for the slowest rank)",
    "bubble": "pipeline bubble",
    "exposed_comm": "exposed communication",
    "gpu_compute": "GPU compute",
    "gpu_memory": "GPU memory copies",
    "gpu_other": "GPU other kernels",
    "gpu_idle": "GPU idle",
    "outside_gpu": "host time outside the GPU span",
    "unattributed": "unattributed (median vs component means)",
}
COMM_PREFIX = "exposed_comm:"
GROUPS = {  # component -> group, for one-line answers ("the change is 70% communication")
    "data_wait": "data",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "step_rest": "compute",
    "gpu_compute": "compute",
    "gpu_memory": "compute",
    "gpu_other": "compute",
    "straggler": "stragglers",
    "bubble": "pipeline bubble",
    "exposed_comm": "communication",
    "gpu_idle": "GPU idle",
    "outside_gpu": "host outside the GPU span",
    "unattributed": "unattributed",
}


def component_group(key: str) -> str:
    return "communication" if key.startswith(COMM_PREFIX) else GROUPS.get(key, "other")


def component_label(key: str) -> str:
    if key.startswith(COMM_PREFIX):
        op, _, pg = key[len(COMM_PREFIX) :].partition("@")
        return f"exposed {op} (group {pg})" if pg else f"exposed {op}"
    return LABELS.get(key, key)


# -- one run ---------------------------------------------------------------------------------------------------
@dataclass
class RunSummary:
    """What a comparison needs of one run: its Report, configuration and per-step components (in ms)."""

    label: str
    path: str
    report: Report
    config: dict
    steps: list[int]
    step_ms: list[float]  # per step of the window: the median rank's iteration
    components_ms: dict[str, list[float]]  # per component, per step; they add up to step_ms
    samples_per_step: float | None = None  # over all data-parallel replicas, median over steps
    tokens_per_step: float | None = None
    gpu_busy_pct: float | None = None  # median over steps of the GPU time of the step / its iteration (CUDA events)
    runnable_pct: float | None = None  # median over steps: the thread's time on a core or waiting for one / iteration
    wait_phase: str | None = None  # the part of the step body its communication waits were taken out of
    nonfinite_steps: int = 0  # steps at which some rank's loss or gradient norm was NaN or infinite

    @property
    def world_size(self) -> int:
        return int(self.config.get("world_size") or len(self.report.run.ranks_found) or 1)

    def to_state(self) -> dict:
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "report"}
        return {**json_safe(state), "report": self.report.to_state()}

    @classmethod
    def from_state(cls, state: dict) -> RunSummary:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in state.items() if k in fields and k != "report"}
        return cls(report=Report.from_state(state["report"]), **values)


def summarize_run(trace, report: Report, label: str | None = None) -> RunSummary:
    """``trace``: the loaded trace the report was made from (only its steps table and manifests are read)."""
    per_step = pd.DataFrame(report.timeline.per_step)
    steps_w = select(trace.steps, report.run.window)
    config = run_config(trace, steps_w)
    summary = RunSummary(
        label=label or str(report.run.path),
        path=str(report.run.path),
        report=report,
        config=config,
        steps=[],
        step_ms=[],
        components_ms={},
    )
    summary.nonfinite_steps = nonfinite_steps(trace.events)
    if per_step.empty:
        return summary
    per_step = per_step.set_index("step").sort_index()
    step_ms = per_step["iteration_median_ms"].astype("float64")
    summary.steps = [int(s) for s in step_ms.index]
    summary.step_ms = [float(v) for v in step_ms]
    if report.gpu_time is not None and report.gpu_time.per_rank:
        components = _gpu_components(report, step_ms)
    else:
        summary.wait_phase = wait_phase(steps_w)
        components = _host_components(report, per_step, steps_w, summary.wait_phase)
    summary.components_ms = {k: [float(x) for x in v] for k, v in components.items()}
    replicas = max(ranks_sharing_tokens(trace), 1)
    for column, attr in (("samples", "samples_per_step"), ("tokens", "tokens_per_step")):
        values = steps_w[column]
        if values.notna().any():
            per = values.astype("float64").groupby(steps_w["step"]).sum() / replicas
            setattr(summary, attr, float(per.median()))
    summary.gpu_busy_pct = _share_of_iteration_pct(steps_w, steps_w["device_us"])
    if "thread_cpu_us" in steps_w and "runqueue_wait_us" in steps_w:
        # the part of a CPU job's step that goes with the cores' speed (its sleeps and I/O do not)
        summary.runnable_pct = _share_of_iteration_pct(steps_w, steps_w["thread_cpu_us"] + steps_w["runqueue_wait_us"])
    return summary


def _share_of_iteration_pct(steps_w: pd.DataFrame, part_us: pd.Series) -> float | None:
    """``part_us`` over each row's iteration (data wait + step body), median over ranks and then over steps, in
    %; None where no row recorded it."""
    part = part_us.astype("float64")
    if not part.notna().any():
        return None
    iteration = (steps_w["data_wait_us"] + steps_w["duration_us"]).astype("float64")
    share = (part / iteration.where(iteration > 0)).groupby(steps_w["step"]).median()
    return float(100 * share.median()) if share.notna().any() else None


def _host_components(
    report: Report, per_step: pd.DataFrame, steps_w: pd.DataFrame, holder: str
) -> dict[str, np.ndarray]:
    step_ms = per_step["iteration_median_ms"].to_numpy(dtype="float64")
    busy_med = per_step["busy_median_ms"].to_numpy(dtype="float64")
    busy_max = per_step["busy_max_ms"].to_numpy(dtype="float64")
    columns = ["data_wait_us", "forward_us", "backward_us", "optimizer_us"]
    med = steps_w.groupby("step")[columns].median().reindex(per_step.index).fillna(0.0)
    phases = {name: med[f"{name}_us"].to_numpy(dtype="float64") / 1e3 for name in ("forward", "backward", "optimizer")}
    data = med["data_wait_us"].to_numpy(dtype="float64") / 1e3
    wait = np.maximum(step_ms - busy_med, 0.0)  # the median rank's waits
    if holder in phases:  # a wait longer than its phase comes out of the rest of the body
        phases[holder] = np.maximum(phases[holder] - wait, 0.0)
    rest = busy_med - data - sum(phases.values())
    exposed = np.clip(step_ms - busy_max, 0.0, wait)
    straggler = wait - exposed
    out = {
        "data_wait": data,
        **phases,
        "step_rest": rest,
        "straggler": straggler,
    }
    if report.bubble is not None:
        bubble = np.full(len(step_ms), max(report.bubble.time_lost_per_step_s, 0.0) * 1e3)
        from_exposed = np.minimum(bubble, exposed)
        from_straggler = np.minimum(bubble - from_exposed, straggler)
        exposed, out["straggler"] = exposed - from_exposed, straggler - from_straggler
        out["bubble"] = from_exposed + from_straggler
    out.update(_split_comm(report, exposed))
    return out


WAIT_PHASE_MIN_CORRELATION = 0.5


def wait_phase(steps_w: pd.DataFrame) -> str:
    """The part of the step body the communication waits sit in: forward, backward, optimizer or step_rest.

    It is the part whose time moves with the host's blocked time (``comm_wait_us``) from rank to rank within a
    step (from step to step with one rank): a rank that waits 40 ms longer for its peers has a 40 ms longer
    backward when DDP waits for its buckets at the end of the backward pass (as diag's capture times it), a
    longer forward under tensor parallelism, a longer rest of the body with explicit collectives after the
    backward. Without such a relation (no waits, or too little variation) it is the backward, DDP's case."""
    if len(steps_w) < 3:
        return "backward"
    f = steps_w[["rank", "step", "duration_us", "forward_us", "backward_us", "optimizer_us", "comm_wait_us"]].astype(
        "float64"
    )
    parts = {
        "forward": f["forward_us"],
        "backward": f["backward_us"],
        "optimizer": f["optimizer_us"],
        "step_rest": f["duration_us"] - f["forward_us"] - f["backward_us"] - f["optimizer_us"],
    }
    wait = f["comm_wait_us"]
    if f["rank"].nunique() > 1:
        by_step = f["step"]
        wait = wait - wait.groupby(by_step).transform("mean")
        parts = {k: v - v.groupby(by_step).transform("mean") for k, v in parts.items()}
    w = wait.to_numpy()
    if not np.isfinite(w).all() or w.std() == 0:
        return "backward"
    best, best_corr = "backward", WAIT_PHASE_MIN_CORRELATION
    for name, values in parts.items():
        x = values.to_numpy()
        if x.std() > 0:
            corr = float(np.corrcoef(x, w)[0, 1])
            if corr > best_corr:
                best, best_corr = name, corr
    return best


def _gpu_components(report: Report, step_ms: pd.Series) -> dict[str, np.ndarray]:
    """torch.profiler runs: the GPU time split per step (mean over ranks), and the host time outside it."""
    ranks = [r for r in report.gpu_time.per_rank if r.steps > 0]
    n = len(step_ms)

    def per_step_ms(attr: str) -> np.ndarray:
        value = float(np.mean([getattr(r, attr) / r.steps for r in ranks])) / 1e3 if ranks else 0.0
        return np.full(n, value)

    out = {
        "gpu_compute": per_step_ms("compute_us"),
        "gpu_memory": per_step_ms("memory_us"),
        "gpu_other": per_step_ms("other_us"),
        "gpu_idle": per_step_ms("idle_us"),
    }
    exposed = per_step_ms("exposed_communication_us")
    span = sum(out.values()) + exposed
    out["outside_gpu"] = step_ms.to_numpy(dtype="float64") - span
    out.update(_split_comm(report, exposed))
    return out


def _split_comm(report: Report, exposed_ms: np.ndarray) -> dict[str, np.ndarray]:
    """Exposed communication per (op, group), in proportion to their transfer time (bytes where untimed)."""
    rows = report.comms.collectives
    if not rows:
        return {"exposed_comm": exposed_ms}
    timed = all(c.total_time_s is not None for c in rows)
    weights: dict[str, float] = {}
    for c in rows:
        key = f"{COMM_PREFIX}{c.op}@{c.pg}"
        weights[key] = weights.get(key, 0.0) + float((c.total_time_s if timed else c.bytes_total) or 0.0)
    total = sum(weights.values())
    if total <= 0:
        weights, total = dict.fromkeys(weights, 1.0), float(len(weights))
    return {key: exposed_ms * w / total for key, w in weights.items()}


def run_config(trace, steps_w: pd.DataFrame | None = None) -> dict:
    """The configuration a comparison lists first when it differs: model (FLOPs per step), layout, dtype,
    batch, device, software (a torch.profiler import fills only some manifest fields: the others are None)."""
    manifests = list(trace.manifests.values())  # {rank: Manifest}, parsed once by the loader

    def first(name):  # the lowest rank's value, an empty one (no process groups recorded) as unknown
        return next((v for m in manifests if (v := getattr(m, name)) not in (None, "", {})), None)

    def plain(value):
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if v is not None and k != "stage"} or None
        return value

    flops = [m.flops_per_step for m in manifests if m.flops_per_step is not None]
    hosts = {m.host for m in manifests} - {None}
    groups = first("process_groups")
    config = {
        "flops_per_step": float(np.median(flops)) if flops else None,
        "world_size": getattr(trace, "world_size", None) or len(getattr(trace, "ranks_found", [])) or None,
        "parallel": plain(first("parallel")),
        "pipeline": plain(first("pipeline")),
        "dtype": first("dtype"),
        "samples_per_rank_step": None,
        "tokens_per_rank_step": None,
        "device": first("device_name"),
        "hosts": len(hosts) or None,
        "backend": first("backend"),
        "process_groups": len(groups) if isinstance(groups, dict) else None,
        "torch_version": first("torch_version"),
        "cuda_version": first("cuda_version"),
        "nccl_version": first("nccl_version"),
        "source": first("source") or "diag",
    }
    if steps_w is not None and len(steps_w):
        for column in ("samples", "tokens"):
            values = steps_w[column].dropna()
            if len(values):
                config[f"{column}_per_rank_step"] = float(values.astype("float64").median())
    return json_safe(config)


# -- statistics ------------------------------------------------------------------------------------------------
@dataclass
class Change:
    """A statistic of the per-step times in two runs, and the bootstrap interval of its relative change."""

    base_s: float | None
    new_s: float | None
    change_pct: float | None
    ci_pct: list[float] | None  # [low, high] at CONFIDENCE


def block_length(n: int) -> int:
    """Moving-block bootstrap block length: about n^(1/3) steps (at least 1)."""
    return max(1, round(n ** (1 / 3)))


def bootstrap_quantiles(values: np.ndarray, q: float, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` moving-block bootstrap replicates of the q-quantile of ``values``."""
    n = len(values)
    block = block_length(n)
    n_blocks = -(-n // block)
    out = np.empty(resamples)
    chunk = max(1, MAX_BOOTSTRAP_CELLS // max(n, 1))
    for lo in range(0, resamples, chunk):
        size = min(chunk, resamples - lo)
        starts = rng.integers(0, n - block + 1, size=(size, n_blocks))
        index = (starts[:, :, None] + np.arange(block)).reshape(size, -1)[:, :n]
        out[lo : lo + size] = np.quantile(values[index], q, axis=1)
    return out


def bootstrap_change(
    base: np.ndarray, new: np.ndarray, q: float = 0.5, resamples: int = RESAMPLES, seed: int = SEED
) -> Change:
    """Relative change (%) of the q-quantile from ``base`` to ``new``, with its bootstrap interval."""
    base, new = np.asarray(base, dtype="float64"), np.asarray(new, dtype="float64")
    base, new = base[np.isfinite(base)], new[np.isfinite(new)]
    if not len(base) or not len(new):
        return Change(None, None, None, None)
    b, n = float(np.quantile(base, q)), float(np.quantile(new, q))
    if b <= 0:
        return Change(b / 1e3, n / 1e3, None, None)
    rng = np.random.default_rng(seed)
    diff = 100 * (bootstrap_quantiles(new, q, resamples, rng) - bootstrap_quantiles(base, q, resamples, rng)) / b
    tail = 100 * (1 - CONFIDENCE) / 2
    ci = [float(np.percentile(diff, tail)), float(np.percentile(diff, 100 - tail))]
    return Change(b / 1e3, n / 1e3, 100 * (n - b) / b, ci)


def drift_pct(step_ms) -> float | None:
    """How much a run's step time varies within itself: its steps split into ``DRIFT_WINDOWS`` consecutive
    windows (at least ``DRIFT_MIN_WINDOW_STEPS`` steps each), the robust standard deviation (1.4826 x the median
    absolute deviation) of the windows' levels (their steady step time, as the verdict reads a run), in % of the
    run's steady step time. None with fewer than 3 windows."""
    x = np.asarray(step_ms, dtype="float64")
    x = x[np.isfinite(x)]
    windows = min(DRIFT_WINDOWS, len(x) // DRIFT_MIN_WINDOW_STEPS)
    steady = float(np.quantile(x, STEADY_QUANTILE)) if len(x) else 0.0
    if windows < 3 or steady <= 0:
        return None
    levels = np.array([np.quantile(part, DRIFT_QUANTILE) for part in np.array_split(x, windows)])
    # a robust standard deviation: one stalled stretch (which the steady quantile itself leaves out) must not set
    # the floor; with the plain one, one window of a run at a load average of 11 made it 105% against 8%
    return float(100 * MAD_TO_SIGMA * np.median(np.abs(levels - np.median(levels))) / steady)


def noise_floor_pct(base_ms, new_ms, run_noise_pct: float = 0.0, correction_pct: float = 0.0) -> float | None:
    """The smallest change of the steady step time that is not the runs' own noise. Each run's level is off the
    job's by its run-to-run noise (``run_noise_pct``: load that stays for a whole run), or by its own drift
    when the run moved more than that within itself (load that came and went during it); the difference of two
    runs' levels has a standard deviation of the two added in quadrature, with the machine correction's own
    (``correction_pct``: how uncertain the share of the step that follows the machine is, times how much the
    machines differed), and the floor is ``NOISE_Z`` of that. A drift that cannot be estimated (too few steps)
    counts as 0; None when nothing is known."""
    drifts = [drift_pct(base_ms), drift_pct(new_ms)]
    if all(d is None for d in drifts) and not run_noise_pct:
        return None
    return float(NOISE_Z * math.hypot(*(max(d or 0.0, run_noise_pct) for d in drifts), correction_pct))


def default_run_noise_pct(base_config: dict, new_config: dict, calibrated: bool = False) -> tuple[float, str]:
    """The measured run-to-run noise for the runs' kind of machine (``RUN_NOISE_PCT``, or
    ``CALIBRATED_RUN_NOISE_PCT`` after the machine-speed correction), and where it came from; 0 where none was
    measured (both runs must be of that kind)."""
    devices = {base_config.get("device"), new_config.get("device")}
    table = CALIBRATED_RUN_NOISE_PCT if calibrated else RUN_NOISE_PCT
    if len(devices) == 1 and (device := devices.pop()) in table:
        return table[device], f"measured default for {'calibrated ' if calibrated else ''}{device} runs"
    return 0.0, "none measured for this kind of machine"


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (the nearest tabled df below)."""
    if df < 1:
        return math.inf
    return T95[max(k for k in T95 if k <= df)] if df <= max(T95) else 1.96


@dataclass
class Repeats:
    """The verdict's evidence from repeats: pairs of runs (base, new) made one after the other or at the same
    time; each pair's change of the steady step time, and the t interval of their mean (log scale, so that the
    changes compose): the pairs' spread is the run-to-run noise, measured instead of assumed."""

    pairs: int
    changes_pct: list[float]  # per pair, new against base
    change_pct: float
    ci_pct: list[float]
    run_noise_pct: float  # one run's level, std between repeats: the pairs' std / sqrt(2)


def repeats_change(bases: list, news: list) -> Repeats | None:
    """Paired comparison of the steady (``STEADY_QUANTILE``) step time of ``bases[i]`` and ``news[i]``; a pair
    where either run has fewer than ``MIN_STEPS`` finite steps is left out; None with fewer than
    ``MIN_REPEATS`` pairs left."""

    def level(run) -> float | None:
        x = np.asarray(run.step_ms, dtype="float64")
        x = x[np.isfinite(x)]
        value = float(np.quantile(x, STEADY_QUANTILE)) if len(x) >= MIN_STEPS else 0.0
        return value if value > 0 else None

    levels = [(level(b), level(n)) for b, n in zip(bases, news, strict=True)]
    levels = [(b, n) for b, n in levels if b is not None and n is not None]
    if len(levels) < MIN_REPEATS:
        return None
    d = np.array([math.log(n / b) for b, n in levels])
    k = len(d)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = t95(k - 1) * sd / math.sqrt(k)
    pct = [100 * math.expm1(x) for x in (mean, mean - half, mean + half)]
    return Repeats(
        pairs=k,
        changes_pct=[100 * math.expm1(x) for x in d],
        change_pct=pct[0],
        ci_pct=[pct[1], pct[2]],
        run_noise_pct=100 * sd / math.sqrt(2),
    )


def _within_noise_note(s: StepTime) -> str:
    """Why a change the steps show is "no change": it is within what runs of one job differ by."""
    if s.repeats is not None:
        r = s.repeats
        return (
            f"the steady step time moved {s.steady_change_pct:+.1f}% over all the steps, but the {r.pairs} pairs of "
            f"repeats moved by {', '.join(f'{c:+.1f}%' for c in r.changes_pct)}: their interval "
            f"[{r.ci_pct[0]:+.1f}%, {r.ci_pct[1]:+.1f}%] does not lie beyond {s.threshold_pct:g}%; more pairs "
            "narrow it"
        )
    m = s.machine
    moved = (
        f"the steady step time moved {s.steady_change_pct:+.1f}%"
        if m is None
        else f"at the same machine speed the job's own change is {m.own_change_pct:+.1f}%"
    )
    drift = f", or by its own drift when larger: {_drift_text(s)}" if s.drift_pct != [None, None] else ""
    correction = f", and the machine correction by {m.correction_noise_pct:.1f}%" if m is not None else ""
    return (
        f"within noise: {moved}, under the noise floor of {s.noise_floor_pct:.1f}% (each run's level is off the "
        f"job's by {s.run_noise_pct:.1f}% from run to run [{s.run_noise_source}]{drift}{correction}); two runs "
        "cannot tell a change this small from other load on the machine: give repeats, BASE NEW BASE NEW ... "
        "--interleaved, or set --run-noise-pct for a quieter machine"
    )


def machine_correction(base: RunSummary, new: RunSummary) -> tuple[MachineComparison | None, tuple | None]:
    """When both runs were calibrated alike: how their machines differed, and both runs' step times at the base
    run's machine speed (diag/analysis/calibration.py); (None, None) otherwise."""
    speeds = base.report.run.machine, new.report.run.machine
    if not comparable(*speeds) or not base.step_ms or not new.step_ms:
        return None, None
    b_speed, n_speed = speeds
    if b_speed.device == "cuda":
        busy = [r.gpu_busy_pct for r in (base, new) if r.gpu_busy_pct is not None]
        prior = min(max(float(np.mean(busy)) / 100, 0.0), 1.0) if busy else 1.0
        reason = "the GPU-busy share of the step (host time does not follow the GPU's clock)" if busy else "assumed 1"
    else:
        prior, reason = _cpu_prior(base, new)
    s, s_sd, source = sensitivity(
        [(b_speed, base.steps, base.step_ms), (n_speed, new.steps, new.step_ms)], prior, reason
    )
    reference = b_speed.factor
    runs = list(zip(speeds, (base, new), strict=True))
    corrected = [corrected_steps(speed, run.steps, run.step_ms, reference, s) for speed, run in runs]
    levels = [interval_levels(speed, run.steps, run.step_ms, reference, s) for speed, run in runs]
    enough = all(len(v) >= MIN_LEVELS for v in levels)
    machine = MachineComparison(
        source=b_speed.source,
        base_factor=b_speed.factor,
        new_factor=n_speed.factor,
        machine_change_pct=100 * (n_speed.factor / b_speed.factor - 1),
        sensitivity=s,
        sensitivity_source=source,
        sensitivity_sd=s_sd,
        # the own change is the measured one less s x the log of the machines' ratio: s's error times that log
        correction_noise_pct=100 * s_sd * abs(math.log(n_speed.factor / b_speed.factor)),
    )
    return machine, (levels if enough else None, *corrected)


def _cpu_prior(base: RunSummary, new: RunSummary) -> tuple[float, str]:
    """The share of a CPU job's step that goes with the cores' speed, when the runs' own intervals cannot tell
    it: the share of the step its thread ran or waited for a core (mean of the two runs). Assuming all of it,
    a job that sleeps for most of its step (a stand-in for device work, I/O) had a 24% lower run-queue factor
    turn an unchanged steady step into a +31% "regression" (benchmarks/bench_compare_noise.py, a CPU burner
    coming and going beside 2-rank runs: 3 of 12 same-job pairs read a change, with this share 0 of 12)."""
    shares = [r.runnable_pct for r in (base, new) if r.runnable_pct is not None]
    if not shares:
        return 1.0, "assumed 1: every part of a CPU job's step runs on the cores the calibration measures"
    share = min(max(float(np.mean(shares)) / 100, 0.0), 1.0)
    return share, f"the share of the step its thread ran or waited for a core ({100 * share:.0f}%)"


def machine_clause(m: MachineComparison) -> str:
    """'the new run's machine was 30% slower (calibration: run-queue wait)', or '... as fast (...)'."""
    how = {"runqueue": "CPU run-queue wait", "kernel": "a fixed kernel's time"}.get(m.source, m.source)
    pct = m.machine_change_pct
    if abs(pct) < THRESHOLD_PCT:
        return f"both runs' machines ran at the same speed (calibration: {how})"
    return f"the new run's machine was {abs(pct):.0f}% {'slower' if pct > 0 else 'faster'} (calibration: {how})"


def _machine_note(m: MachineComparison) -> str:
    return (
        f"the steady step time moved {m.raw_steady_change_pct:+.1f}% as measured, but {machine_clause(m)}: at the "
        f"same machine speed the job's own change is {m.own_change_pct:+.1f}% (the step goes with the machine's "
        f"speed at a share of {m.sensitivity:.2f}, {m.sensitivity_source})"
    )


def _drift_text(s) -> str:
    return " and ".join("-" if d is None else f"{d:.1f}%" for d in s.drift_pct)


def significant(change: Change, threshold_pct: float) -> int:
    """+1 (slower), -1 (faster) or 0 (within the interval or the threshold)."""
    if change.change_pct is None or change.ci_pct is None:
        return 0
    low, high = change.ci_pct
    if low <= 0 <= high or abs(change.change_pct) < threshold_pct:
        return 0
    return 1 if change.change_pct > 0 else -1


def beyond_threshold(change: Change, threshold_pct: float) -> int:
    """+1 (slower), -1 (faster) or 0: the repeats' verdict, a change only when its whole interval lies beyond the
    threshold. Their t interval from a few pairs is a 95% one, so same-job pairs that happen to agree read as a
    change in one comparison in twenty (18 real runs: 2 at 3 pairs, a +3.3% "regression" once); beyond
    the threshold as well, one in a hundred (docs/compare.md, "Repeats")."""
    if change.change_pct is None or change.ci_pct is None:
        return 0
    low, high = change.ci_pct
    return 1 if low > threshold_pct else -1 if high < -threshold_pct else 0


def central_steps(step_ms: np.ndarray) -> np.ndarray:
    """Indices of the steps whose time is nearest the median: ``CENTRAL_FRACTION`` of them (at least
    ``CENTRAL_MIN_STEPS``), so their mean stays near the median even when slow steps skew the distribution."""
    n = len(step_ms)
    k = min(n, max(CENTRAL_MIN_STEPS, math.ceil(CENTRAL_FRACTION * n)))
    return np.argsort(np.abs(step_ms - np.median(step_ms)), kind="stable")[:k]


def central_means(summary: RunSummary) -> tuple[float | None, dict[str, float]]:
    """Mean step time and mean of every component over the run's central steps (``central_steps``)."""
    step_ms = np.asarray(summary.step_ms, dtype="float64")
    if not len(step_ms):
        return None, {}
    keep = central_steps(step_ms)
    means = {k: float(np.asarray(v, dtype="float64")[keep].mean()) for k, v in summary.components_ms.items()}
    return float(step_ms[keep].mean()), means


# -- comparison ------------------------------------------------------------------------------------------------
@dataclass
class StepTime:
    base_s: float | None  # median step time
    new_s: float | None
    change_pct: float | None
    ci_pct: list[float] | None
    steady_quantile: float
    steady_base_s: float | None  # the verdict's statistic: lower decile of step time
    steady_new_s: float | None
    steady_change_pct: float | None
    steady_ci_pct: list[float] | None
    threshold_pct: float
    drift_pct: list[float | None]  # each run's own drift: std of its windows' levels, % of its steady step time
    noise_floor_pct: float | None  # NOISE_Z x the two drifts added in quadrature: smaller changes are noise
    steps_base: int
    steps_new: int
    resamples: int
    block_steps: list[int]  # bootstrap block length in each run
    run_noise_pct: float = 0.0  # one run's level off the job's (run-to-run noise), in the floor with the drifts
    run_noise_source: str = ""  # where run_noise_pct came from: the measured default, --run-noise-pct, repeats
    within_noise: bool = False  # "no change" although the steps alone show one: it is under the noise floor
    repeats: Repeats | None = None  # --interleaved: the verdict's evidence from pairs of runs
    # both runs calibrated (diag/analysis/calibration.py): the machines' speeds and the job's own change after the
    # correction, which the verdict, drift and noise floor then read; None: compared as measured
    machine: MachineComparison | None = None


@dataclass
class Attribution:
    component: str
    label: str
    base_ms: float
    new_ms: float
    delta_ms: float
    share_pct: float | None  # of the change of the median step time; None when the verdict is "no change"


@dataclass
class Comparison:
    base: str
    new: str
    verdict: str  # regression, improvement, no change, unknown
    summary: str  # one line
    config_differences: list[dict]  # {key, base, new}
    step_time: StepTime
    attribution: list[Attribution]
    groups: list[dict]  # {group, base_ms, new_ms, delta_ms, share_pct}: attribution rows added up by group
    metrics: dict  # name -> {base, new, change_pct}: mfu, tflops_per_gpu, samples_per_s, tokens_per_s, gpu_busy_pct
    memory: dict
    busbw: list[dict]  # {op, size_class, size_class_min_bytes, base_gbps, new_gbps, change_pct, base_count, new_count}
    findings_added: list[dict]
    findings_removed: list[dict]
    notes: list[str] = field(default_factory=list)
    stability: dict | None = None  # loss and training health side by side (compare_stability); None: not recorded


@dataclass
class ScalingGrowth:
    component: str
    label: str
    ms: float  # per step, beyond the baseline's scaled to the ideal step
    share_pct: float | None  # of the loss


@dataclass
class ScalingRun:
    label: str
    world_size: int
    step_s: float | None  # median
    throughput: float | None  # per second, in the unit
    throughput_per_gpu: float | None
    speedup: float | None  # throughput against the baseline
    efficiency_pct: float | None  # throughput per GPU against the baseline
    ideal_step_s: float | None
    loss_ms: float | None  # per step, beyond the ideal
    grew: list[ScalingGrowth] = field(default_factory=list)  # largest first
    summary: str = ""


@dataclass
class Scaling:
    kind: str  # weak, strong, mixed
    unit: str  # tokens, samples, or rank-steps
    baseline: str
    runs: list[ScalingRun]
    notes: list[str] = field(default_factory=list)


@dataclass
class RunBrief:
    label: str
    path: str
    world_size: int
    steps_analysed: int
    step_s: float | None  # median
    steady_step_s: float | None
    per_step_ms: list[float]
    components_ms: dict[str, float]  # central means
    config: dict
    wait_phase: str | None = None  # the part of the step body its communication waits were taken out of
    loss_steps: list[int] = field(default_factory=list)  # every step with a finite loss (diag.record) ...
    loss: list[float] = field(default_factory=list)  # ... and its loss, the median over ranks (the loss figure)


@dataclass
class CompareReport:
    runs: list[RunBrief]
    comparisons: list[Comparison]  # every run after the first against the first
    scaling: Scaling | None

    def to_dict(self) -> dict:
        """The JSON contract (docs/compare.md): the first comparison (BASE against NEW) at the top level, every
        comparison under ``comparisons``, the runs and scaling."""
        first = json_safe(self.comparisons[0]) if self.comparisons else {}
        return {
            "compare_version": COMPARE_VERSION,
            **first,
            "scaling": json_safe(self.scaling) if self.scaling is not None else None,
            "runs": json_safe(self.runs),
            "comparisons": [json_safe(c) for c in self.comparisons],
        }


COMPARE_VERSION = 1


def compare_runs(
    runs: list[RunSummary],
    threshold_pct: float = THRESHOLD_PCT,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    run_noise_pct: float | None = None,
    interleaved: bool = False,
) -> CompareReport:
    """Every run after the first against the first; with ``interleaved``, the runs alternate base and new
    (BASE NEW BASE NEW ...: repeats of the same two jobs) and are compared as one pooled base against one pooled
    new, the verdict read from the pairs (``repeats_change``). ``run_noise_pct``: the run-to-run noise of the
    floor (None: the measured default for the runs' kind of machine, ``RUN_NOISE_PCT``)."""
    if len(runs) < 2:
        raise ValueError("compare needs at least two runs")
    briefs = [_brief(r) for r in runs]
    if interleaved:
        if len(runs) % 2 or len(runs) < 2 * MIN_REPEATS:
            raise ValueError(
                f"--interleaved needs pairs of runs, BASE NEW BASE NEW ... (at least {MIN_REPEATS} pairs), "
                f"got {len(runs)} runs"
            )
        bases, news = runs[0::2], runs[1::2]
        pooled = [pool_runs(bases), pool_runs(news)]
        comparison = _compare(*pooled, threshold_pct, resamples, seed, run_noise_pct, (bases, news))
        return CompareReport(briefs, [comparison], analyze_scaling(pooled))
    comparisons = [_compare(runs[0], r, threshold_pct, resamples, seed, run_noise_pct) for r in runs[1:]]
    return CompareReport(briefs, comparisons, analyze_scaling(runs))


def pool_runs(runs: list[RunSummary]) -> RunSummary:
    """Repeats of one job as one run: their steps one after the other (for the step-time distribution and the
    attribution); the report (findings, memory, collectives, stability) and configuration are the first's."""
    first = runs[0]
    keys = list(dict.fromkeys(k for r in runs for k in r.components_ms))
    # a component one repeat lacks (no collective of that group in it) was 0 in each of its steps
    components = {k: [v for r in runs for v in r.components_ms.get(k, [0.0] * len(r.step_ms))] for k in keys}
    return dataclasses.replace(
        first,
        label=f"{first.label} (+{len(runs) - 1} repeats)",
        steps=[s for r in runs for s in r.steps],
        step_ms=[v for r in runs for v in r.step_ms],
        components_ms=components,
    )


def _brief(run: RunSummary) -> RunBrief:
    step_ms = np.asarray(run.step_ms, dtype="float64")
    _, means = central_means(run)
    loss = losses(run.report.health)
    return RunBrief(
        label=run.label,
        path=run.path,
        world_size=run.world_size,
        steps_analysed=len(step_ms),
        step_s=float(np.median(step_ms)) / 1e3 if len(step_ms) else None,
        steady_step_s=float(np.quantile(step_ms, STEADY_QUANTILE)) / 1e3 if len(step_ms) else None,
        per_step_ms=[float(v) for v in step_ms],
        components_ms=means,
        config=run.config,
        wait_phase=run.wait_phase,
        loss_steps=sorted(loss),
        loss=[loss[k] for k in sorted(loss)],
    )


def _compare(
    base: RunSummary,
    new: RunSummary,
    threshold_pct: float,
    resamples: int,
    seed: int,
    run_noise_pct: float | None = None,
    repeats: tuple[list[RunSummary], list[RunSummary]] | None = None,
) -> Comparison:
    b, n = np.asarray(base.step_ms), np.asarray(new.step_ms)
    median = bootstrap_change(b, n, 0.5, resamples, seed)
    steady = bootstrap_change(b, n, STEADY_QUANTILE, resamples, seed + 1)
    machine, corrected = (None, None) if repeats is not None else machine_correction(base, new)
    if machine is not None:  # the verdict, the drift and the floor read the steps at the base run's machine speed
        levels, b, n = corrected
        if levels is not None:  # calibrated often enough: the intervals' levels, resampled
            change, ci = levels_change(*levels, resamples, seed + 2, CONFIDENCE)
            own = Change(float(np.median(levels[0])) / 1e3, float(np.median(levels[1])) / 1e3, change, ci)
        else:  # one or two intervals: each step at its interval's speed, the steady step time as without
            own = bootstrap_change(b, n, STEADY_QUANTILE, resamples, seed + 2)
        machine.raw_steady_change_pct, machine.raw_steady_ci_pct = steady.change_pct, steady.ci_pct
        machine.own_change_pct, machine.own_ci_pct = own.change_pct, own.ci_pct
        machine.statistic = "median of the intervals' levels" if levels is not None else "steady step time"
    by_levels = machine is not None and levels is not None
    pairs = repeats_change(*repeats) if repeats is not None else None
    if repeats is not None:
        noise, source = (pairs.run_noise_pct, f"measured by {pairs.pairs} pairs of repeats") if pairs else (0.0, "")
    elif run_noise_pct is not None:
        noise, source = run_noise_pct, "--run-noise-pct"
    else:
        noise, source = default_run_noise_pct(base.config, new.config, calibrated=by_levels)
    correction = machine.correction_noise_pct if machine is not None else 0.0
    floor_pct = None if repeats else noise_floor_pct(*(([], []) if by_levels else (b, n)), noise, correction)
    step_time = StepTime(
        base_s=median.base_s,
        new_s=median.new_s,
        change_pct=median.change_pct,
        ci_pct=median.ci_pct,
        steady_quantile=STEADY_QUANTILE,
        steady_base_s=steady.base_s,
        steady_new_s=steady.new_s,
        steady_change_pct=steady.change_pct,
        steady_ci_pct=steady.ci_pct,
        threshold_pct=threshold_pct,
        # with repeats the pairs measure the noise: a pooled run's windows would mix its repeats' levels; with the
        # intervals' levels, their spread is in the interval already
        drift_pct=[None, None] if repeats or by_levels else [drift_pct(b), drift_pct(n)],
        noise_floor_pct=floor_pct,
        steps_base=len(b),
        steps_new=len(n),
        resamples=resamples,
        block_steps=[block_length(len(b)), block_length(len(n))],
        run_noise_pct=noise,
        run_noise_source=source,
        repeats=pairs,
        machine=machine,
    )
    notes = []
    if min(len(b), len(n)) < MIN_STEPS:
        verdict = "unknown"
        notes.append(f"too few steps analysed ({len(b)} and {len(n)}; at least {MIN_STEPS} each) for a verdict")
    elif repeats is not None and pairs is None:
        verdict = "unknown"
        notes.append(
            f"fewer than {MIN_REPEATS} pairs of repeats with at least {MIN_STEPS} steps in both runs: no verdict "
            "from the repeats"
        )
    else:
        floor = step_time.noise_floor_pct or 0.0
        if pairs is not None:  # the pairs' interval is the verdict's: their spread is the run-to-run noise
            evidence = Change(steady.base_s, steady.new_s, pairs.change_pct, pairs.ci_pct)
            direction = beyond_threshold(evidence, threshold_pct)
        else:
            direction = significant(own if machine is not None else steady, max(threshold_pct, floor))
        verdict = {1: "regression", -1: "improvement", 0: "no change"}[direction]
        evidence_change = own if machine is not None else steady
        step_time.within_noise = direction == 0 and significant(evidence_change, threshold_pct) != 0
        if step_time.within_noise:
            notes.append(_within_noise_note(step_time))
        moved = significant(median, max(threshold_pct, floor))
        if machine is not None and direction == 0 and significant(steady, max(threshold_pct, floor)):
            notes.append(_machine_note(machine))
        elif direction == 0 and moved and not step_time.within_noise and machine is None:
            notes.append(
                f"the median step moved {median.change_pct:+.1f}% but the steady (lower-decile) step time did not: "
                "only some steps were slower (faster): other load on the host, or intermittent stalls; rerun on a "
                "quiet machine, or compare longer runs, to tell"
            )
    if base.world_size != new.world_size:
        notes.append(
            f"world sizes differ ({base.world_size} and {new.world_size} ranks): step time is per step, "
            "see scaling for throughput per GPU"
        )
    attribution = _attribution(base, new, median, verdict)
    comparison = Comparison(
        base=base.label,
        new=new.label,
        verdict=verdict,
        summary="",
        config_differences=config_differences(base.config, new.config),
        step_time=step_time,
        attribution=attribution,
        groups=attribution_groups(attribution),
        metrics=_metrics(base, new),
        memory=_memory(base.report, new.report),
        busbw=_busbw(base.report, new.report),
        findings_added=_findings_diff(new.report, base.report),
        findings_removed=_findings_diff(base.report, new.report),
        notes=notes,
        stability=compare_stability(base.report.health, new.report.health, base.nonfinite_steps, new.nonfinite_steps),
    )
    comparison.summary = _summary(comparison)
    return comparison


def _attribution(base: RunSummary, new: RunSummary, median: Change, verdict: str) -> list[Attribution]:
    base_total, base_means = central_means(base)
    new_total, new_means = central_means(new)
    if base_total is None or new_total is None or median.base_s is None:
        return []
    rows = []
    for key in list(dict.fromkeys([*base_means, *new_means])):
        b, n = base_means.get(key, 0.0), new_means.get(key, 0.0)
        rows.append(Attribution(key, component_label(key), b, n, n - b, None))
    change_ms = (median.new_s - median.base_s) * 1e3
    rest_ms = change_ms - (new_total - base_total)
    rows.append(
        Attribution(
            "unattributed",
            LABELS["unattributed"],
            median.base_s * 1e3 - base_total,
            median.new_s * 1e3 - new_total,
            rest_ms,
            None,
        )
    )
    if verdict in ("regression", "improvement") and change_ms:
        for row in rows:
            row.share_pct = 100 * row.delta_ms / change_ms
    order = list(LABELS)
    return sorted(rows, key=lambda r: (-abs(r.delta_ms), order.index(r.component) if r.component in order else 99))


def attribution_groups(rows: list[Attribution]) -> list[dict]:
    """Attribution rows added up by ``component_group``, largest change first."""
    groups: dict[str, dict] = {}
    for row in rows:
        g = groups.setdefault(
            component_group(row.component),
            {
                "group": component_group(row.component),
                "base_ms": 0.0,
                "new_ms": 0.0,
                "delta_ms": 0.0,
                "share_pct": None,
            },
        )
        g["base_ms"] += row.base_ms
        g["new_ms"] += row.new_ms
        g["delta_ms"] += row.delta_ms
        if row.share_pct is not None:
            g["share_pct"] = (g["share_pct"] or 0.0) + row.share_pct
    return sorted(groups.values(), key=lambda g: -abs(g["delta_ms"]))


def config_differences(base: dict, new: dict) -> list[dict]:
    """Keys whose values differ (in ``run_config``'s order: model, layout, dtype, batch, device, software)."""
    out = []
    for key in dict.fromkeys([*base, *new]):
        b, n = base.get(key), new.get(key)
        if b is None and n is None:
            continue
        if isinstance(b, float) and isinstance(n, float) and math.isclose(b, n, rel_tol=1e-9):
            continue
        if b != n:
            out.append({"key": key, "base": b, "new": n})
    return out


def _change(b, n) -> dict:
    pct = 100 * (n - b) / b if b not in (None, 0) and n is not None else None
    return {"base": b, "new": n, "change_pct": pct}


def _metrics(base: RunSummary, new: RunSummary) -> dict:
    out = {}
    for name in ("median", "tflops_per_gpu", "samples_per_s", "tokens_per_s"):
        b, n = getattr(base.report.mfu, name), getattr(new.report.mfu, name)
        if b is not None or n is not None:
            out["mfu" if name == "median" else name] = _change(b, n)
    if base.gpu_busy_pct is not None or new.gpu_busy_pct is not None:
        out["gpu_busy_pct"] = _change(base.gpu_busy_pct, new.gpu_busy_pct)
    return out


def memory_summary(report: Report) -> dict:
    """Peaks over ranks and the spread between ranks (of peak allocated on CUDA, peak RSS on CPU), in bytes."""
    ranks = report.memory.per_rank

    def peak(attr):
        values = [getattr(r, attr) for r in ranks if getattr(r, attr) is not None]
        return (max(values), min(values)) if values else (None, None)

    alloc, reserved, rss = peak("peak_allocated_bytes"), peak("peak_reserved_bytes"), peak("rss_peak_bytes")
    spread_of = alloc if alloc[0] is not None else rss
    return {
        "metric": ranks[0].metric if ranks else None,
        "peak_allocated_bytes": alloc[0],
        "peak_reserved_bytes": reserved[0],
        "peak_rss_bytes": rss[0],
        "rank_spread_bytes": spread_of[0] - spread_of[1] if spread_of[0] is not None else None,
    }


def _memory(base: Report, new: Report) -> dict:
    b, n = memory_summary(base), memory_summary(new)
    out = {"metric": n["metric"] or b["metric"]}
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes", "rank_spread_bytes"):
        out[key] = _change(b[key], n[key])
    return out


def _busbw_by_class(report: Report) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for c in report.comms.collectives:
        key = (c.op, c.size_bucket_min_bytes)
        row = out.setdefault(key, {"size_class": c.size_bucket, "count": 0, "weighted": 0.0, "timed": 0})
        row["count"] += c.count
        if c.busbw_gbps is not None and c.timed_count:
            row["weighted"] += c.busbw_gbps * c.timed_count
            row["timed"] += c.timed_count
    return out


def _busbw(base: Report, new: Report) -> list[dict]:
    """Bus bandwidth per collective op and size class (count-weighted over groups), in both runs."""
    b, n = _busbw_by_class(base), _busbw_by_class(new)
    rows = []
    for key in sorted(set(b) | set(n)):
        bb, nn = b.get(key), n.get(key)
        bgb = bb["weighted"] / bb["timed"] if bb and bb["timed"] else None
        ngb = nn["weighted"] / nn["timed"] if nn and nn["timed"] else None
        rows.append(
            {
                "op": key[0],
                "size_class": (bb or nn)["size_class"],
                "size_class_min_bytes": key[1],
                "base_gbps": bgb,
                "new_gbps": ngb,
                "change_pct": _change(bgb, ngb)["change_pct"],
                "base_count": bb["count"] if bb else 0,
                "new_count": nn["count"] if nn else 0,
            }
        )
    return rows


def _findings_diff(report: Report, other: Report) -> list[dict]:
    """Findings of ``report`` with no finding of the same kind on the same ranks in ``other``."""
    keys = {(f.kind, tuple(f.ranks)) for f in other.findings}
    return [
        {
            "kind": f.kind,
            "severity": f.severity,
            "title": f.title,
            "ranks": list(f.ranks),
            "time_lost_per_step_s": f.time_lost_per_step_s,
        }
        for f in report.findings
        if (f.kind, tuple(f.ranks)) not in keys
    ]


def _summary(c: Comparison) -> str:
    s = c.step_time
    if c.verdict == "unknown":
        return "no verdict: too few steps"
    if s.repeats is not None:  # the verdict's change is the pairs' mean
        r = s.repeats
        head = (
            f"{c.verdict}: step time {_ms(s.base_s)} -> {_ms(s.new_s)} ({_signed(s.change_pct)} median over all "
            f"steps; steady {_signed(r.change_pct)} [{_signed(r.ci_pct[0])}, {_signed(r.ci_pct[1])}] over "
            f"{r.pairs} pairs of repeats)"
        )
        return head + _largest(c)
    m = s.machine
    if m is not None and m.own_ci_pct:
        head = (
            f"{c.verdict}: {machine_clause(m)}; the job's own change: {_signed(m.own_change_pct)} "
            f"[{_signed(m.own_ci_pct[0])}, {_signed(m.own_ci_pct[1])}]"
            + (f" (noise floor {s.noise_floor_pct:.1f}%)" if s.noise_floor_pct else "")
            + f"; step time {_ms(s.base_s)} -> {_ms(s.new_s)} as measured ({_signed(s.change_pct)} median, steady "
            f"{_signed(s.steady_change_pct)})"
        )
        return head + _largest(c)
    head = (
        f"{c.verdict}: step time {_ms(s.base_s)} -> {_ms(s.new_s)} ({_signed(s.change_pct)} median, steady "
        f"{_signed(s.steady_change_pct)} [{_signed(s.steady_ci_pct[0])}, {_signed(s.steady_ci_pct[1])}])"
        if s.steady_ci_pct
        else f"{c.verdict}: step time {_ms(s.base_s)} -> {_ms(s.new_s)}"
    )
    if c.verdict == "no change" and s.within_noise:
        head = head.replace("no change:", "no change (within noise):", 1)
    return head + _largest(c)


def _largest(c: Comparison) -> str:
    if c.verdict in ("regression", "improvement"):
        top = next((a for a in c.attribution if a.component != "unattributed"), None)
        if top is not None and top.share_pct is not None:
            return f"; largest: {top.label} {top.delta_ms:+.1f} ms/step ({top.share_pct:.0f}% of the change)"
    return ""


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _signed(pct) -> str:
    return "-" if pct is None else f"{pct:+.1f}%"


# -- scaling ---------------------------------------------------------------------------------------------------
def analyze_scaling(runs: list[RunSummary]) -> Scaling | None:
    """Throughput per GPU against the smallest run, and which components grew, when world sizes differ."""
    if len({r.world_size for r in runs}) < 2:
        return None
    if all(r.tokens_per_step for r in runs):
        unit, work = "tokens", [r.tokens_per_step for r in runs]
    elif all(r.samples_per_step for r in runs):
        unit, work = "samples", [r.samples_per_step for r in runs]
    else:
        unit, work = "rank-steps", [float(r.world_size) for r in runs]
    worlds = [r.world_size for r in runs]
    ref = int(np.argmin(worlds))
    per_rank = [w / n for w, n in zip(work, worlds, strict=True)]
    notes = []
    if unit == "rank-steps":
        kind = "weak"
        notes.append("no samples or tokens recorded (diag.step(samples=..., tokens=...)): each rank is assumed to do "
                     "the same work per step in every run (weak scaling)")  # fmt: skip
    elif all(math.isclose(p, per_rank[ref], rel_tol=SAME_BATCH_TOLERANCE) for p in per_rank):
        kind = "weak"
    elif all(math.isclose(w, work[ref], rel_tol=SAME_BATCH_TOLERANCE) for w in work):
        kind = "strong"
    else:
        kind = "mixed"
        notes.append(
            "neither the per-rank nor the global batch is the same in every run: efficiency is throughput per GPU"
        )
    ref_run = runs[ref]
    ref_step = np.median(ref_run.step_ms) / 1e3 if ref_run.step_ms else None
    ref_total, ref_means = central_means(ref_run)
    ref_per_gpu = work[ref] / ref_step / worlds[ref] if ref_step else None
    out = []
    for run, w, n in zip(runs, work, worlds, strict=True):
        step_s = float(np.median(run.step_ms)) / 1e3 if run.step_ms else None
        throughput = w / step_s if step_s else None
        per_gpu = throughput / n if throughput is not None else None
        eff = per_gpu / ref_per_gpu if per_gpu is not None and ref_per_gpu else None
        row = ScalingRun(
            label=run.label,
            world_size=n,
            step_s=step_s,
            throughput=throughput,
            throughput_per_gpu=per_gpu,
            speedup=throughput / (ref_per_gpu * worlds[ref]) if throughput is not None and ref_per_gpu else None,
            efficiency_pct=100 * eff if eff is not None else None,
            ideal_step_s=step_s * eff if eff is not None else None,
            loss_ms=(step_s - step_s * eff) * 1e3 if eff is not None else None,
        )
        if run is not ref_run and eff is not None and ref_total:
            row.grew = _growth(run, ref_means, ref_step, row)
            row.summary = _scaling_line(row, worlds[ref])
        out.append(row)
    return Scaling(kind, unit, ref_run.label, out, notes)


def _growth(run: RunSummary, ref_means: dict[str, float], ref_step_s: float, row: ScalingRun) -> list[ScalingGrowth]:
    _, means = central_means(run)
    scale = row.ideal_step_s / ref_step_s
    grew = {k: means.get(k, 0.0) - ref_means.get(k, 0.0) * scale for k in dict.fromkeys([*ref_means, *means])}
    grew["unattributed"] = row.loss_ms - sum(grew.values())
    loss = row.loss_ms
    rows = [
        ScalingGrowth(k, component_label(k), v, 100 * v / loss if loss and loss > 0 else None) for k, v in grew.items()
    ]
    return sorted(rows, key=lambda g: -g.ms)


def _scaling_line(row: ScalingRun, ref_world: int) -> str:
    head = f"{row.efficiency_pct:.0f}% efficient at {row.world_size} ranks (against {ref_world})"
    if row.loss_ms is None or row.loss_ms <= 0:
        return head + ": no loss"
    top = next((g for g in row.grew if g.component != "unattributed" and g.share_pct is not None), None)
    if top is None or top.ms <= 0:
        return head + f"; the loss is {row.loss_ms:.1f} ms/step"
    if top.share_pct > 100:  # other components shrank: a share beyond the whole reads as an error
        return head + (
            f"; the loss ({row.loss_ms:.1f} ms/step) is {top.label}, which grew {top.ms:.1f} ms/step while other "
            "parts shrank"
        )
    return head + f"; the loss ({row.loss_ms:.1f} ms/step) is {top.share_pct:.0f}% {top.label}"
