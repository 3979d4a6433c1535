"""Pipeline bubbles: how long each pipeline stage idles in a step, against what its schedule implies.

Pure pandas over ``trace.microbatches`` (no torch). Definitions, all per step and then averaged over the steps
analysed:

* step span: from the first compute action's start on any stage to the last compute action's end on any stage
  (times aligned to rank 0's clock with each manifest's ``clock_offset_us``). Waits are not compute.
* busy: the sum of a stage's compute durations (forward, backward, backward_input, backward_weight);
  idle = span - busy; bubble fraction = idle / span. A stage held by several ranks (data-parallel replicas of
  the pipeline) is the mean of those ranks.
* warm-up idle: idle between the span's start and the stage's first backward (or backward_input); cool-down
  idle: idle between max(its last forward's end, its first backward's start) and the span's end; steady
  idle: the rest. Without any backward (forward-only runs) the warm-up ends at the first compute action and
  the cool-down starts at the last one's end.
* measured fraction: the mean of the stages' bubble fractions. Theoretical fraction: see
  ``theoretical_fraction``.
* work: busy less the time its actions waited for a core (``runqueue_wait_us``; see ``_excess_over_noise``),
  plus its optimizer step (``steps.optimizer_us``).
* imbalance: the slowest stage is the one with the most work; its excess is its work over the other stages'
  (per step, by medians) - 1. A pipeline advances at the pace of its slowest stage, so with the work spread
  evenly the span would shrink by about span x (1 - mean work / max work): the time lost to the imbalance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.findings import Finding, FindingContext, severity_for
from diag.analysis.section import Section, json_safe
from diag.analysis.stragglers import (
    MAX_INDEPENDENT_STEPS,
    MEDIAN_STANDARD_ERROR,
    MIN_PERSISTENT_STEPS,
    SPREAD_PER_MAD,
)
from diag.trace.manifest import PipelineLayout

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("optimizer_us",)}

COMPUTE_ACTIONS = ("forward", "backward", "backward_input", "backward_weight")
BACKWARD_START_ACTIONS = ("backward", "backward_input")  # a stage's first backward ends its warm-up
BUBBLE_FINDING_MIN = 0.10  # measured bubble share of the step worth a finding
IMBALANCE_MIN = 0.10  # slowest stage this much above the others: advise rebalancing
IMBALANCE_Z_MIN = 3.0  # ... and its excess this many standard errors of its own step-to-step spread
SCHEDULE_GAP_MIN = 0.05  # measured within this of theory: the schedule, not imbalance, is to blame
TARGET_BUBBLE = 0.10  # the bubble share "more micro-batches" advice aims for


@dataclass
class StageBubble:
    stage: int
    ranks: list[int]
    busy_s: float  # per step, mean over the steps analysed
    work_s: float  # busy_s less the time its actions waited for a core (a loaded CPU host), plus its optimizer step
    idle_s: float
    bubble_fraction: float
    warmup_idle_s: float
    steady_idle_s: float
    cooldown_idle_s: float


@dataclass
class BubbleReport:
    schedule: str | None
    stages: int  # pipeline ranks p
    virtual_stages: int  # model chunks per rank v
    microbatches: int
    steps_analysed: int
    step_span_s: float  # mean pipeline span of a step
    theoretical_fraction: float | None  # None for schedules without a known figure
    theory: str  # the formula used, with its source
    measured_fraction: float
    per_stage: list[StageBubble]
    slowest_stage: int
    slowest_stage_excess_fraction: float
    slowest_stage_time_lost_per_step_s: float  # span lost to the imbalance
    slowest_stage_evidence_z: float  # its excess in standard errors of its step-to-step spread
    time_lost_per_step_s: float  # mean idle of a stage per step: the whole bubble, in seconds
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def imbalanced(self) -> bool:
        """The slowest stage computes longer than the others by more than the rebalancing threshold and the
        step-to-step noise."""
        return (
            len(self.per_stage) > 1
            and self.slowest_stage_excess_fraction >= IMBALANCE_MIN
            and self.slowest_stage_evidence_z >= IMBALANCE_Z_MIN
        )


# -- theory -----------------------------------------------------------------------------------------------
def theoretical_fraction(
    schedule: str | None, p: int, m: int, v: int = 1, times_s: dict | None = None
) -> tuple[float | None, str]:
    """The share of a step a stage idles under ``schedule`` with equal stages and free communication.

    * GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush; Narayanan et al. 2021): (p-1)/(m+p-1).
    * Interleaved 1F1B with v chunks per rank (Narayanan et al. 2021, "Efficient Large-Scale Language Model
      Training on GPU Clusters Using Megatron-LM", sec. 2.2.2): the bubble time shrinks by v, so
      (p-1)/(v*m+p-1).
    * Zero bubble (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241) splits backward into
      B (input gradient) and W (weight gradient). With per-chunk times F, B, W from the trace: ZB-H1 / ZB1P
      (torch's ScheduleInterleavedZeroBubble) idles (p-1)(F+B-W) per rank, a third of 1F1B's when F=B=W
      (sec. 2.1); ZB-V (ScheduleZBVZeroBubble, sec. 6) idles 0 when F=B=W; for unequal times we use the
      ZB-H2 figure (p-1)*max(0, F+B-2W) (sec. 2.2), an approximation. The fraction is bubble / (bubble +
      v*m*(F+B+W)).
    * Other schedules (LoopedBFS, DualPipeV, unknown names): None.
    """
    name = (schedule or "").lower()
    if p < 1 or m < 1:
        return None, "unknown: no stages or micro-batches"
    if "zbv" in name or "zerobubble" in name or "zero_bubble" in name:
        return _zero_bubble_fraction(name, p, m, v, times_s or {})
    if "interleaved" in name:
        return (p - 1) / (v * m + p - 1), "(p-1)/(v*m+p-1), interleaved 1F1B (Narayanan et al. 2021)"
    if "gpipe" in name or "1f1b" in name:
        return (p - 1) / (m + p - 1), "(p-1)/(m+p-1), GPipe / 1F1B (Huang et al. 2019; Narayanan et al. 2021)"
    return None, f"no theoretical figure for schedule {schedule!r}"


def _zero_bubble_fraction(name: str, p: int, m: int, v: int, times_s: dict) -> tuple[float | None, str]:
    f, b, w = (times_s.get(k) for k in ("forward", "backward_input", "backward_weight"))
    if not (f and b and w):
        return None, "zero-bubble figure needs measured forward, backward_input and backward_weight times"
    if "zbv" in name:
        bubble_s, text = (p - 1) * max(0.0, f + b - 2 * w), "ZB-V: (p-1)*max(0,F+B-2W) (Qi et al. 2023, approx.)"
    else:
        bubble_s, text = (p - 1) * max(0.0, f + b - w), "ZB-H1: (p-1)*(F+B-W) (Qi et al. 2023)"
    return bubble_s / (bubble_s + v * m * (f + b + w)), text


# -- measurement ------------------------------------------------------------------------------------------
def analyze_bubble(trace, window_steps=None) -> BubbleReport | None:
    """The bubble report of a run, or None when it recorded no pipeline micro-batches.

    ``window_steps``: the step indices to analyse; by default every step all pipeline ranks recorded except
    the first, whose extra work (shape inference, communicator set-up) is not the schedule's.
    """
    rows = _aligned_rows(trace)
    if rows.empty:
        return None
    notes: list[str] = []
    if rows["has_device_time"].any():
        notes.append(
            "GPU run: the bubble is measured on host times (an action's launch to its return); where the host runs "
            "ahead of the GPU the idle shown is not the GPU's. Per-action GPU times are in microbatches.device_us"
        )
    rows = _select_steps(rows, window_steps, notes)
    if rows.empty:
        return None
    spans = _step_spans(rows)
    per_rank_step = _rank_step_idle(rows, spans)
    keys = pd.MultiIndex.from_arrays([per_rank_step["rank"], per_rank_step["step"]])
    per_rank_step["work"] += _optimizer_us(trace.steps, keys)
    per_stage = _per_stage(per_rank_step)
    layout = _layout(trace, rows)
    times_s = _mean_action_times_s(rows)
    theory, text = theoretical_fraction(
        layout["schedule"], layout["stages"], layout["microbatches"], layout["v"], times_s
    )
    measured = float(np.mean([s.bubble_fraction for s in per_stage]))
    span_s = float(spans["span_us"].mean()) / 1e6
    slowest, imbalance_s = _imbalance(per_stage, span_s)
    excess, evidence_z = _excess_over_noise(per_rank_step, slowest)
    return BubbleReport(
        schedule=layout["schedule"],
        stages=layout["stages"],
        virtual_stages=layout["v"],
        microbatches=layout["microbatches"],
        steps_analysed=int(spans.shape[0]),
        step_span_s=span_s,
        theoretical_fraction=theory,
        theory=text,
        measured_fraction=measured,
        per_stage=per_stage,
        slowest_stage=slowest,
        slowest_stage_excess_fraction=excess,
        slowest_stage_time_lost_per_step_s=imbalance_s,
        slowest_stage_evidence_z=evidence_z,
        time_lost_per_step_s=float(np.mean([s.idle_s for s in per_stage])),
        notes=notes,
    )


def _aligned_rows(trace) -> pd.DataFrame:
    """Compute rows with start/end in microseconds on rank 0's clock."""
    mb = trace.microbatches
    if mb is None or mb.empty:
        return pd.DataFrame()
    rows = mb[mb["action"].astype(str).isin(COMPUTE_ACTIONS)]
    if rows.empty:
        return pd.DataFrame()
    offsets = trace.clock_offsets_us()
    start = rows["start_us"].astype("float64") - rows["rank"].map(offsets).fillna(0.0).astype("float64")
    return pd.DataFrame(
        {
            "rank": rows["rank"].astype("int64").to_numpy(),
            "step": rows["step"].astype("int64").to_numpy(),
            "stage": rows["stage"].astype("int64").to_numpy(),
            "virtual_stage": rows["virtual_stage"].astype("int64").to_numpy(),
            "microbatch": rows["microbatch"].astype("int64").to_numpy(),
            "action": rows["action"].astype(str).to_numpy(),
            "start": start.to_numpy(),
            "end": (start + rows["duration_us"].astype("float64")).to_numpy(),
            "duration": rows["duration_us"].astype("float64").to_numpy(),
            "core_wait": rows["runqueue_wait_us"].astype("float64").fillna(0.0).clip(lower=0).to_numpy(),
            "has_device_time": rows["device_us"].notna().to_numpy(),
        }
    )


def stage_work_per_step_us(microbatches: pd.DataFrame, steps: pd.DataFrame | None) -> pd.Series:
    """Each rank's work in each step, indexed by (rank, step): its compute actions' durations less the time
    they waited for a core, plus its optimizer step. Empty without pipeline rows, and where capture did not
    record those waits: on a loaded host, wall time alone swings by more than the spikes it would be searched
    for (43-387 ms a step for one stage of a healthy run at load none on 2 cores)."""
    if microbatches is None or microbatches.empty or microbatches["runqueue_wait_us"].isna().all():
        return pd.Series(dtype="float64")
    rows = microbatches[microbatches["action"].astype(str).isin(COMPUTE_ACTIONS) & (microbatches["step"] >= 0)]
    work = rows["duration_us"].astype("float64") - rows["runqueue_wait_us"].astype("float64").fillna(0.0).clip(lower=0)
    work = work.clip(lower=0).groupby([rows["rank"].astype("int64"), rows["step"].astype("int64")]).sum()
    return work + _optimizer_us(steps, work.index)


def _optimizer_us(steps: pd.DataFrame | None, keys: pd.MultiIndex) -> np.ndarray:
    """Each (rank, step)'s optimizer time, 0 where none was recorded. Each stage steps its own optimizer after
    the schedule: that is its work too (a stage slow there holds the next step's schedule back), though outside
    the span the bubble is measured on."""
    if steps is None or steps.empty or "optimizer_us" not in steps:
        return np.zeros(len(keys))
    optimizer = steps.set_index(["rank", "step"])["optimizer_us"].astype("float64")
    return optimizer[~optimizer.index.duplicated(keep="last")].reindex(keys).fillna(0.0).to_numpy()


def _select_steps(rows: pd.DataFrame, window_steps, notes: list[str]) -> pd.DataFrame:
    rows = rows[rows["step"] >= 0]
    ranks_per_step = rows.groupby("step")["rank"].nunique()
    complete = ranks_per_step.index[ranks_per_step == rows["rank"].nunique()]
    if window_steps is not None:
        chosen = complete.intersection(pd.Index(list(window_steps)))
    else:
        chosen = complete[1:] if len(complete) > 1 else complete
        if len(complete) > 1:
            notes.append(f"step {int(complete[0])} (the first) left out: it includes the pipeline's set-up")
    if len(complete) < len(ranks_per_step):
        notes.append(f"{len(ranks_per_step) - len(complete)} steps not recorded by every pipeline rank left out")
    return rows[rows["step"].isin(chosen)]


def _step_spans(rows: pd.DataFrame) -> pd.DataFrame:
    spans = rows.groupby("step").agg(span_start=("start", "min"), span_end=("end", "max"))
    spans["span_us"] = spans["span_end"] - spans["span_start"]
    return spans


def _rank_step_idle(rows: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): busy, idle and its warm-up / steady / cool-down split, in microseconds."""
    rows = rows.join(spans, on="step")
    keys = ["rank", "step"]
    is_backward = rows["action"].isin(BACKWARD_START_ACTIONS)
    is_forward = rows["action"] == "forward"
    bounds = rows.groupby(keys).agg(
        stage=("stage", "first"),
        busy=("duration", "sum"),
        core_wait=("core_wait", "sum"),
        span_start=("span_start", "first"),
        span_end=("span_end", "first"),
        first_start=("start", "min"),
        last_end=("end", "max"),
    )
    first_bwd = rows[is_backward].groupby(keys)["start"].min()
    last_fwd = rows[is_forward].groupby(keys)["end"].max()
    bounds["warm_end"] = first_bwd.reindex(bounds.index).fillna(bounds["first_start"])
    cool = np.maximum(last_fwd.reindex(bounds.index).to_numpy(), bounds["warm_end"].to_numpy())
    no_backward = ~bounds.index.isin(first_bwd.index)
    bounds["cool_start"] = np.where(no_backward, bounds["last_end"], cool)
    bounds["cool_start"] = bounds["cool_start"].fillna(bounds["last_end"])
    rows = rows.join(bounds[["warm_end", "cool_start"]], on=keys)
    bounds["busy_warm"] = (
        _overlap(rows, rows["span_start"], rows["warm_end"]).groupby([rows["rank"], rows["step"]]).sum()
    )
    bounds["busy_cool"] = (
        _overlap(rows, rows["cool_start"], rows["span_end"]).groupby([rows["rank"], rows["step"]]).sum()
    )
    span = bounds["span_end"] - bounds["span_start"]
    bounds["idle"] = (span - bounds["busy"]).clip(lower=0)
    bounds["warmup_idle"] = (bounds["warm_end"] - bounds["span_start"] - bounds["busy_warm"]).clip(lower=0)
    bounds["cooldown_idle"] = (bounds["span_end"] - bounds["cool_start"] - bounds["busy_cool"]).clip(lower=0)
    bounds["steady_idle"] = (bounds["idle"] - bounds["warmup_idle"] - bounds["cooldown_idle"]).clip(lower=0)
    bounds["span"] = span
    bounds["work"] = (bounds["busy"] - bounds["core_wait"]).clip(lower=0)
    return bounds.reset_index()


def _overlap(rows: pd.DataFrame, lo: pd.Series, hi: pd.Series) -> pd.Series:
    """Microseconds of each action inside [lo, hi]."""
    return (np.minimum(rows["end"], hi) - np.maximum(rows["start"], lo)).clip(lower=0)


def _per_stage(per_rank_step: pd.DataFrame) -> list[StageBubble]:
    per_rank = per_rank_step.groupby("rank").agg(
        stage=("stage", "first"),
        busy=("busy", "mean"),
        work=("work", "mean"),
        idle=("idle", "mean"),
        span=("span", "mean"),
        warmup=("warmup_idle", "mean"),
        steady=("steady_idle", "mean"),
        cooldown=("cooldown_idle", "mean"),
    )
    stages = []
    for stage, group in per_rank.groupby("stage", sort=True):
        span_us = float(group["span"].mean())
        stages.append(
            StageBubble(
                stage=int(stage),
                ranks=sorted(int(r) for r in group.index),
                busy_s=float(group["busy"].mean()) / 1e6,
                work_s=float(group["work"].mean()) / 1e6,
                idle_s=float(group["idle"].mean()) / 1e6,
                bubble_fraction=float(group["idle"].mean()) / span_us if span_us > 0 else 0.0,
                warmup_idle_s=float(group["warmup"].mean()) / 1e6,
                steady_idle_s=float(group["steady"].mean()) / 1e6,
                cooldown_idle_s=float(group["cooldown"].mean()) / 1e6,
            )
        )
    return stages


def _imbalance(per_stage: list[StageBubble], span_s: float) -> tuple[int, float]:
    """The stage with the most work per step (busy time less waiting for a core) and the span it costs the
    pipeline per step."""
    slowest = max(per_stage, key=lambda s: s.work_s)
    mean_work_s = float(np.mean([s.work_s for s in per_stage]))
    lost_s = span_s * (1 - mean_work_s / slowest.work_s) if slowest.work_s > 0 else 0.0
    return slowest.stage, float(lost_s)


def _excess_over_noise(per_rank_step: pd.DataFrame, stage: int) -> tuple[float, float]:
    """How much longer ``stage`` computes than the others, and how sure that is: (the median over steps of its
    work over the other stages' median in the same step, minus 1; that excess in standard errors of its own
    step-to-step spread). Per step and by medians, because a loaded host slows a stage for a few steps at a time:
    a stage that computes a little longer in two noisy steps of twelve is no imbalance to rebalance layers for.
    Work, not busy time: on a CPU host with more runnable threads than cores, the last stage of a 1F1B schedule
    runs its forward and backward back to back and is preempted in them more than the stages that sleep in
    receives between actions (20% longer, z 4.8, in a healthy 4-stage job on 2 loaded cores). Steps count as at
    most ``MAX_INDEPENDENT_STEPS`` samples, as in the straggler analysis; fewer than ``MIN_PERSISTENT_STEPS``
    are no evidence of a pattern."""
    busy = per_rank_step.groupby(["step", "stage"])["work"].mean().unstack("stage")
    others = busy.drop(columns=[stage])
    if others.empty or busy.shape[0] == 0:
        return 0.0, 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (busy[stage] / others.median(axis=1)).replace([np.inf, -np.inf], np.nan).dropna()
    if ratio.empty:
        return 0.0, 0.0
    excess = float(ratio.median()) - 1
    if len(ratio) < MIN_PERSISTENT_STEPS:
        return excess, 0.0
    spread = SPREAD_PER_MAD * float((ratio - ratio.median()).abs().median())
    samples = min(len(ratio), MAX_INDEPENDENT_STEPS)
    standard_error = MEDIAN_STANDARD_ERROR * spread / np.sqrt(samples)
    evidence_z = excess / standard_error if standard_error > 0 else (np.inf if excess > 0 else 0.0)
    return excess, float(min(evidence_z, 1e6))


def _layout(trace, rows: pd.DataFrame) -> dict:
    """Schedule, p, m, v from the manifests' ``pipeline`` layout, else as counted in the rows."""
    recorded = trace.first_manifest_value("pipeline") or PipelineLayout()
    per_rank_chunks = rows.groupby("rank")["virtual_stage"].nunique()
    per_step_mbs = rows.groupby(["rank", "step"])["microbatch"].nunique()
    return {
        "schedule": recorded.schedule,
        "stages": int(recorded.stages or rows["stage"].nunique()),
        "v": int(recorded.virtual_stages or per_rank_chunks.max()),
        "microbatches": int(recorded.microbatches or per_step_mbs.max()),
    }


def _mean_action_times_s(rows: pd.DataFrame) -> dict[str, float]:
    """Mean duration of one action on one chunk, by action (for the zero-bubble figures)."""
    return {str(a): float(d) / 1e6 for a, d in rows.groupby("action")["duration"].mean().items()}


# -- finding and timeline -------------------------------------------------------------------------------------
def bubble_findings(report: BubbleReport, ctx: FindingContext | None = None) -> list[Finding]:
    """A ``pipeline_bubble`` finding when the stages idle at least ``BUBBLE_FINDING_MIN`` of the step, graded as
    every finding is, by its share of the step (of the window's median step, else of the pipeline's)."""
    if report.measured_fraction < BUBBLE_FINDING_MIN:
        return []
    measured = report.measured_fraction
    step_s = ctx.step_s if ctx is not None and ctx.step_s else report.step_span_s
    imbalanced = report.imbalanced
    slowest = next(s for s in report.per_stage if s.stage == report.slowest_stage)
    evidence = [
        f"stages idle {measured:.0%} of a {report.step_span_s * 1e3:.1f} ms pipeline step "
        f"({report.schedule or 'unknown schedule'}, p={report.stages}, m={report.microbatches}, "
        f"v={report.virtual_stages})",
        _theory_evidence(report),
    ]
    if imbalanced:
        evidence.append(
            f"stage {slowest.stage} computes {report.slowest_stage_excess_fraction:.0%} longer than the others; "
            f"the pipeline loses about {report.slowest_stage_time_lost_per_step_s * 1e3:.1f} ms per step to it"
        )
    finding = Finding(
        kind="pipeline_bubble",
        severity=severity_for(report.time_lost_per_step_s, step_s),
        title=f"Pipeline bubble: stages idle {measured:.0%} of each step",
        ranks=slowest.ranks if imbalanced else sorted(r for s in report.per_stage for r in s.ranks),
        time_lost_s=report.time_lost_per_step_s * report.steps_analysed,
        time_lost_per_step_s=report.time_lost_per_step_s,
        evidence=evidence,
        advice=_advice(report, imbalanced),
    )
    return [finding]


def _theory_evidence(report: BubbleReport) -> str:
    if report.theoretical_fraction is None:
        return f"no theoretical figure for this schedule ({report.theory})"
    return f"the schedule alone implies {report.theoretical_fraction:.0%} ({report.theory})"


def _advice(report: BubbleReport, imbalanced: bool) -> str:
    parts = []
    if imbalanced:
        parts.append(
            f"Rebalance layers: move work off stage {report.slowest_stage} (or give it fewer layers) until the "
            "stages' busy times match."
        )
    theory = report.theoretical_fraction
    if theory is not None and theory >= BUBBLE_FINDING_MIN:
        p = report.stages
        wanted_m = int(np.ceil((p - 1) * (1 - TARGET_BUBBLE) / TARGET_BUBBLE / report.virtual_stages))
        parts.append(
            f"The schedule itself idles {theory:.0%}: use more micro-batches (about {wanted_m} for a "
            f"{TARGET_BUBBLE:.0%} bubble with p={p}), an interleaved schedule (ScheduleInterleaved1F1B with "
            "several chunks per rank), or a zero-bubble schedule (ScheduleZBVZeroBubble)."
        )
    if theory is not None and report.measured_fraction - theory >= SCHEDULE_GAP_MIN and not imbalanced:
        parts.append(
            "The measured bubble exceeds the schedule's by "
            f"{report.measured_fraction - theory:.0%}: look at the send/recv waits (slow links, blocking "
            "communication) in the timeline."
        )
    return " ".join(parts) or "Use more micro-batches or an interleaved schedule to shrink the bubble."


def gantt_rows(trace, step: int | None = None) -> pd.DataFrame:
    """One step's compute actions for a timeline: stage, rank, virtual_stage, microbatch, action, start_ms
    and duration_ms from the step's start. Default step: the last one every pipeline rank recorded."""
    rows = _aligned_rows(trace)
    if rows.empty:
        return pd.DataFrame(
            columns=["stage", "rank", "virtual_stage", "microbatch", "action", "start_ms", "duration_ms"]
        )
    ranks_per_step = rows.groupby("step")["rank"].nunique()
    complete = ranks_per_step.index[ranks_per_step == rows["rank"].nunique()]
    chosen = step if step is not None else int(complete.max() if len(complete) else rows["step"].max())
    one = rows[rows["step"] == chosen]
    origin = one["start"].min()
    return pd.DataFrame(
        {
            "stage": one["stage"],
            "rank": one["rank"],
            "virtual_stage": one["virtual_stage"],
            "microbatch": one["microbatch"],
            "action": one["action"],
            "start_ms": (one["start"] - origin) / 1e3,
            "duration_ms": one["duration"] / 1e3,
        }
    ).reset_index(drop=True)


SECTION = Section("bubble", bubble_findings, json=lambda bubble: {"bubble": json_safe(bubble.to_dict())})
