"""GPU time of torch.profiler (Kineto) traces: per rank, how the GPU's time splits into computation,
communication, memory copies and idle, and how much communication computation hides.

Pure pandas/numpy over ``trace.gpu_kernels`` (``diag.trace.kineto``, where ``kernel_kind`` classifies every
kernel). Definitions follow Holistic Trace Analysis (hta/analyzers/breakdown_analysis.py
``get_temporal_breakdown``, hta/analyzers/communication_analysis.py ``get_comm_comp_overlap``) so the two
agree on the numbers both compute. Per rank, over the GPU activities launched in the analysed steps:

* span: from the first activity's start to the last one's end (HTA's ``kernel_time``);
* busy: the union of all activities' intervals on all streams; idle = span - busy (HTA's ``idle_time``);
* compute: the union of computation kernels (HTA's ``compute_time``);
* communication: the union of NCCL kernels; overlap: the part of it during which a computation kernel also
  ran; exposed communication = communication - overlap. Overlap share = overlap / communication (HTA's
  ``comp_comm_overlap_pctg``);
* memory: the union of memcpy/memset/dma activities while neither computation nor communication ran;
* other: the rest of busy (kernels HTA counts as neither, e.g. ``...Sync``). HTA's ``non_compute_time`` is
  exposed communication + memory + other.

HTA drops the last ``ProfilerStep`` (it may be cut by the profiler stopping) and rounds float timestamps to
whole microseconds (ceil start, floor end) unless HTA_DISABLE_NS_ROUNDING=1; diag keeps the timestamps as
recorded, so with HTA's rounding on the two differ by up to 1 us per activity: see docs/kineto.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.findings import Finding, FindingContext, severity_for
from diag.analysis.section import Section

EXPOSED_COMM_MIN = 0.05  # exposed communication share of the span worth a finding
IDLE_MIN = 0.10  # GPU idle share of the span worth a finding


@dataclass
class RankGpuTime:
    rank: int
    steps: int  # steps whose activities are counted
    kernels: int
    span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    communication_us: float  # union of NCCL kernels, overlapped or not
    overlap_us: float  # communication while computation ran
    exposed_communication_us: float
    memory_us: float  # memcpy/memset while neither computation nor communication ran
    other_us: float
    non_compute_us: float  # HTA's non_compute_time: span - compute - idle
    idle_pct: float  # of the span
    compute_pct: float
    exposed_communication_pct: float
    memory_pct: float
    non_compute_pct: float
    comm_comp_overlap_pct: float | None  # overlap / communication; None without communication


@dataclass
class GpuTimeReport:
    per_rank: list[RankGpuTime] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # steps analysed
    nccl_kernels: int = 0
    note: str | None = None


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the same time as ``[start, end)``."""
    if len(start) == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.r_[True, start[1:] > reach[:-1]]  # HTA's rule: touching intervals merge
    return start[new], np.maximum.reduceat(end, np.flatnonzero(new))


def length(start: np.ndarray, end: np.ndarray) -> float:
    return float((end - start).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both of two unions (each disjoint)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    deltas = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.lexsort((deltas, times))  # at equal times ends first: touching intervals do not overlap
    times, running = times[order], np.cumsum(deltas[order])
    both = running[:-1] == 2
    return float((np.diff(times)[both]).sum())


def rank_gpu_time(rank: int, kernels: pd.DataFrame) -> RankGpuTime:
    start, end = kernels["ts_us"].to_numpy(), kernels["end_us"].to_numpy()
    kind = kernels["kind"].to_numpy()
    everything = union(start, end)
    span = float(end.max() - start.min())
    busy = length(*everything)
    parts = {k: union(start[kind == k], end[kind == k]) for k in ("compute", "communication", "memory")}
    compute, comm = length(*parts["compute"]), length(*parts["communication"])
    overlap = intersection_length(parts["compute"], parts["communication"])
    comp_or_comm = union(
        np.r_[parts["compute"][0], parts["communication"][0]], np.r_[parts["compute"][1], parts["communication"][1]]
    )
    memory = length(*parts["memory"]) - intersection_length(parts["memory"], comp_or_comm)
    exposed = comm - overlap
    idle = span - busy

    def pct(value: float) -> float:
        return 100 * value / span if span > 0 else 0.0

    return RankGpuTime(
        rank=int(rank),
        steps=int(kernels["step"].nunique()),
        kernels=len(kernels),
        span_us=span,
        busy_us=busy,
        idle_us=idle,
        compute_us=compute,
        communication_us=comm,
        overlap_us=overlap,
        exposed_communication_us=exposed,
        memory_us=memory,
        other_us=max(busy - compute - exposed - memory, 0.0),
        non_compute_us=span - compute - idle,
        idle_pct=pct(idle),
        compute_pct=pct(compute),
        exposed_communication_pct=pct(exposed),
        memory_pct=pct(memory),
        non_compute_pct=pct(span - compute - idle),
        comm_comp_overlap_pct=100 * overlap / comm if comm > 0 else None,
    )


def analyze_gpu_time(kernels: pd.DataFrame | None, steps: np.ndarray) -> GpuTimeReport | None:
    """GPU time per rank over the activities launched in ``steps``; None when the trace has no kernel table
    (diag's own traces)."""
    if kernels is None:
        return None
    report = GpuTimeReport(steps=[int(s) for s in steps])
    if kernels.empty:
        report.note = "no GPU activity in the traces (a CPU-only profile)"
        return report
    selected = kernels[kernels["step"].isin(steps)]
    if selected.empty:
        report.note = "no GPU activity was launched during the analysed steps"
        return report
    report.nccl_kernels = int((selected["kind"] == "communication").sum())
    report.per_rank = [rank_gpu_time(rank, group) for rank, group in selected.groupby("rank", sort=True)]
    return report


def gpu_time_findings(report: GpuTimeReport, ctx: FindingContext) -> list[Finding]:
    """Exposed communication and GPU idle time, costed per step as the mean over ranks."""
    steps, step_s = ctx.steps, ctx.step_s
    if not report.per_rank or not steps:
        return []
    out = []
    ranks = report.per_rank
    spans = np.array([r.span_us for r in ranks])
    exposed = np.array([r.exposed_communication_us for r in ranks])
    idle = np.array([r.idle_us for r in ranks])
    if spans.sum() > 0 and exposed.sum() >= EXPOSED_COMM_MIN * spans.sum():
        per_step = float(exposed.mean()) / 1e6 / steps
        worst = sorted(ranks, key=lambda r: -r.exposed_communication_us)[:3]
        out.append(
            Finding(
                kind="gpu_exposed_communication",
                severity=severity_for(per_step, step_s),
                title=f"NCCL kernels not hidden behind computation: {per_step * 1e3:.1f} ms/step of GPU time",
                ranks=[r.rank for r in worst if r.exposed_communication_us > 0],
                time_lost_s=per_step * steps,
                time_lost_per_step_s=per_step,
                evidence=[
                    f"rank {r.rank}: {r.exposed_communication_pct:.1f}% of its GPU time is communication alone; "
                    f"{_pct(r.comm_comp_overlap_pct)} of its communication overlaps computation"
                    for r in worst
                ],
                advice="Overlap communication with computation: DDP bucket_cap_mb and gradient-as-bucket-view, FSDP "
                "forward/backward prefetch, or fewer/larger collectives; check the NCCL kernels' bandwidth.",
            )
        )
    if spans.sum() > 0 and idle.sum() >= IDLE_MIN * spans.sum():
        per_step = float(idle.mean()) / 1e6 / steps
        worst = sorted(ranks, key=lambda r: -r.idle_us)[:3]
        out.append(
            Finding(
                kind="gpu_idle_time",
                severity=severity_for(per_step, step_s),
                title=f"GPU idle between kernels: {per_step * 1e3:.1f} ms/step",
                ranks=[r.rank for r in worst],
                time_lost_s=per_step * steps,
                time_lost_per_step_s=per_step,
                evidence=[f"rank {r.rank}: no kernel ran for {r.idle_pct:.1f}% of its GPU span" for r in worst],
                advice="The host does not launch work fast enough: look for synchronisations (.item(), .cpu(), "
                "cudaStreamSynchronize), data loading on the critical path, many tiny kernels (CUDA graphs, "
                "torch.compile), or larger batches.",
            )
        )
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


SECTION = Section("gpu_time", gpu_time_findings)
