"""Memory per rank: headroom before OOM, allocator fragmentation and retries, and growth that looks like a leak.

Growth is the least-squares slope of the memory in use at the end of each step (CUDA allocated bytes, or the
process RSS on CPU runs) against the step index. A leak is suspected when that slope explains the readings
well (r² >= ``LEAK_R2``) and adds up to a meaningful amount over the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import pandas as pd

from diag.analysis.engine import Shard
from diag.analysis.findings import Finding, FindingContext, ranks_text
from diag.analysis.memory_deep import DeepMemory
from diag.analysis.memory_plan import PlanComparison
from diag.analysis.oom import OomExplanation, byte_text
from diag.analysis.section import Section, json_safe
from diag.analysis.window import StepWindow, in_window

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {
    "memory": (
        "allocated_bytes",
        "allocated_peak_bytes",
        "reserved_bytes",
        "reserved_peak_bytes",
        "alloc_retries",
        "ooms",
        "rss_bytes",
        "param_bytes",
        "grad_bytes",
        "optimizer_state_bytes",
    ),
    "telemetry": ("mem_total_bytes", "process_mem_used_bytes", "other_processes_mem_used_bytes"),
}

LEAK_R2 = 0.8
LEAK_MIN_GROWTH_FRACTION = 0.01  # growth over the window, as a share of the median reading
LEAK_MIN_GROWTH_BYTES = 16 * 2**20
NEAR_OOM_HEADROOM_PCT = 10.0


@dataclass
class RankMemory:
    rank: int
    metric: str  # "allocated_bytes" (CUDA) or "rss_bytes" (CPU)
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    device_total_bytes: int | None  # from telemetry, when present
    headroom_pct: float | None  # 100 * (1 - peak reserved / device total)
    fragmentation_pct: float | None  # mean reserved-but-unallocated share of reserved at step ends
    alloc_retries: int | None  # increase over the window
    ooms: int | None
    rss_peak_bytes: int | None
    growth_bytes_per_step: float | None
    growth_r2: float | None
    growth_total_bytes: float | None  # slope x steps in the window
    steps_to_oom: float | None  # at that growth, from the peak reserved to the device total
    leak_suspected: bool = False
    near_oom: bool = False
    # where it went (memory categories; None when no model or optimizer was instrumented)
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    activation_peak_bytes: int | None = None  # largest step peak allocated minus the three above (CUDA only)
    non_pytorch_bytes: int | None = None  # NVML's memory of the process minus the allocator's reserved bytes
    other_processes_bytes: int | None = None  # other processes on the same GPU (NVML)


@dataclass
class CategorySpread:
    """How one category differs across ranks: the rank holding most and least."""

    category: str  # param_bytes, grad_bytes, optimizer_state_bytes, activation_peak_bytes, non_pytorch_bytes
    max_rank: int
    max_bytes: int
    min_rank: int
    min_bytes: int


@dataclass
class MemoryReport:
    per_rank: list[RankMemory] = field(default_factory=list)
    closest_to_oom: list[int] = field(default_factory=list)  # ranks by headroom, least first (up to 5)
    note: str | None = None
    spread: list[CategorySpread] = field(default_factory=list)  # categories that differ across ranks, most first
    ooms: list[OomExplanation] = field(default_factory=list)  # why each OOM happened (the first few)
    plan: PlanComparison | None = None  # diag memory-plan's prediction against the measured categories
    deep: list[DeepMemory] = field(default_factory=list)  # the deep mode's steps, by rank (memory_deep.json)


def analyze_memory(
    mem_w: pd.DataFrame, device_total: dict[int, int], tel_w: pd.DataFrame | None = None
) -> MemoryReport:
    """Per-rank memory over the window; ``tel_w``: the window's telemetry, for memory outside PyTorch."""
    return finish_memory(map_memory(mem_w, device_total, tel_w))


@dataclass(frozen=True)
class MemoryAnalysis:
    """The memory report over the ranks (diag.analysis.engine): per-rank rows, finished with the run's metric and
    count of steps, which no shard of ranks knows alone."""

    window: StepWindow
    reads: ClassVar = READS

    def map(self, shard: Shard) -> MemoryPartial:
        mem = shard.table("memory")
        tel = shard.table("telemetry")
        return map_memory(mem[in_window(mem["step"], self.window)], device_totals(tel), shard.telemetry_in_window())

    def combine(self, a: MemoryPartial, b: MemoryPartial) -> MemoryPartial:
        return MemoryPartial(
            a.rows + b.rows, {**a.levels, **b.levels}, np.union1d(a.steps, b.steps), a.has_allocated or b.has_allocated
        )

    def finish(self, partial: MemoryPartial) -> MemoryReport:
        return finish_memory(partial)


@dataclass
class MemoryPartial:
    """Some ranks' memory rows, their growth at their shard's metric; the run's metric (allocated bytes when any
    shard has them) and its count of steps are applied by ``finish_memory``."""

    rows: list[RankMemory]
    levels: dict[int, float]  # rank -> median reading of its row's metric (0 without one)
    steps: np.ndarray  # distinct steps with readings in the window
    has_allocated: bool


@dataclass(frozen=True)
class DeviceTotals:
    """Per rank, the largest mem_total_bytes of its telemetry (the GPU's memory), over every sample."""

    reads: ClassVar = {"telemetry": ("mem_total_bytes",)}

    def map(self, shard: Shard) -> dict[int, int]:
        return device_totals(shard.table("telemetry"))

    def combine(self, a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
        return {**a, **b}

    def finish(self, partial: dict[int, int]) -> dict[int, int]:
        return dict(sorted(partial.items()))


def device_totals(tel: pd.DataFrame) -> dict[int, int]:
    if tel.empty:
        return {}
    return {int(r): int(t) for r, t in tel.groupby("rank")["mem_total_bytes"].max().dropna().items()}


def map_memory(mem_w: pd.DataFrame, device_total: dict[int, int], tel_w: pd.DataFrame | None) -> MemoryPartial:
    """Some ranks' rows over the window, everything but the growth over the run's steps."""
    if mem_w.empty:
        return MemoryPartial([], {}, np.zeros(0, dtype="int64"), False)
    metric = memory_metric(mem_w)
    growth = _growth(mem_w, metric)
    g = mem_w.groupby("rank")
    agg = pd.DataFrame(
        {
            "alloc_peak": g["allocated_peak_bytes"].max(),
            "reserved_peak": g["reserved_peak_bytes"].max(),
            "rss_peak": g["rss_bytes"].max(),
            "retries": g["alloc_retries"].max() - g["alloc_retries"].min(),
            "ooms": g["ooms"].max(),
            "level": g[metric].median(),
        }
    )
    reserved = mem_w["reserved_bytes"].astype("float64")
    unused = (reserved - mem_w["allocated_bytes"].astype("float64")) / reserved.where(reserved > 0)
    agg["frag"] = (100 * unused).groupby(mem_w["rank"]).mean()
    partial = MemoryPartial(
        [], {}, np.unique(mem_w["step"].to_numpy(dtype="int64")), bool(mem_w["allocated_bytes"].notna().any())
    )
    for rank, row in agg.iterrows():
        slope, r2 = growth.get(rank, (None, None))
        total = device_total.get(int(rank))
        peak_reserved = _int(row["reserved_peak"])
        headroom = 100 * (1 - peak_reserved / total) if total and peak_reserved is not None else None
        partial.levels[int(rank)] = _float(row["level"]) or 0.0
        partial.rows.append(
            RankMemory(
                rank=int(rank),
                metric=metric,
                peak_allocated_bytes=_int(row["alloc_peak"]),
                peak_reserved_bytes=peak_reserved,
                device_total_bytes=total,
                headroom_pct=headroom,
                fragmentation_pct=_float(row["frag"]),
                alloc_retries=_int(row["retries"]),
                ooms=_int(row["ooms"]),
                rss_peak_bytes=_int(row["rss_peak"]),
                growth_bytes_per_step=slope,
                growth_r2=r2,
                growth_total_bytes=None,
                steps_to_oom=None,
                near_oom=headroom is not None and headroom < NEAR_OOM_HEADROOM_PCT,
            )
        )
    _add_categories(partial.rows, mem_w, tel_w)
    return partial


def finish_memory(partial: MemoryPartial) -> MemoryReport:
    """The report from the ranks' rows: each rank's growth over the run's steps, then the comparison of ranks."""
    if not partial.rows:
        return MemoryReport(note="no memory readings in the window")
    metric = "allocated_bytes" if partial.has_allocated else "rss_bytes"
    report = MemoryReport()
    for row in sorted(partial.rows, key=lambda r: r.rank):
        level = partial.levels[row.rank]
        if row.metric != metric:  # read beside no allocator reading, in a run with some: none of its own either
            row = replace(row, metric=metric, growth_bytes_per_step=None, growth_r2=None)
            level = 0.0
        report.per_rank.append(_with_growth(row, level, len(partial.steps)))
    return compare_ranks(report)


def _with_growth(row: RankMemory, level: float, n_steps: int) -> RankMemory:
    """The rank's growth over the window's ``n_steps`` and whether it looks like a leak."""
    slope, total, peak_reserved = row.growth_bytes_per_step, row.device_total_bytes, row.peak_reserved_bytes
    growth_total = slope * n_steps if slope is not None else None
    leak = bool(
        slope is not None
        and slope > 0
        and (row.growth_r2 or 0) >= LEAK_R2
        and growth_total >= max(LEAK_MIN_GROWTH_BYTES, LEAK_MIN_GROWTH_FRACTION * level)
    )
    to_oom = (total - peak_reserved) / slope if leak and total and peak_reserved is not None else None
    return replace(row, growth_total_bytes=growth_total, steps_to_oom=to_oom, leak_suspected=leak)


def compare_ranks(report: MemoryReport) -> MemoryReport:
    """The cross-rank parts of the report from its per-rank rows: the ranks closest to OOM, the categories'
    spread."""
    with_headroom = [r for r in report.per_rank if r.headroom_pct is not None]
    report.closest_to_oom = [r.rank for r in sorted(with_headroom, key=lambda r: r.headroom_pct)[:5]]
    report.spread = _spread(report.per_rank)
    return report


CATEGORIES = ("param_bytes", "grad_bytes", "optimizer_state_bytes")
SPREAD_MIN_FRACTION = 0.01  # a category differing by less than this share of its largest is not imbalance


def category_series(mem: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): parameters, gradients, optimizer state and activations (the step's peak allocated minus
    the three; empty without a CUDA allocator), in bytes. Empty when no categories were recorded."""
    if mem.empty or "param_bytes" not in mem or mem["param_bytes"].isna().all():
        return pd.DataFrame(columns=["rank", "step", *CATEGORIES, "activation_bytes"])
    out = mem[["rank", "step", *CATEGORIES]].copy()
    held = sum(out[c].astype("float64") for c in CATEGORIES)
    out["activation_bytes"] = (mem["allocated_peak_bytes"].astype("float64") - held).clip(lower=0)
    return out


def _add_categories(rows: list[RankMemory], mem_w: pd.DataFrame, tel_w: pd.DataFrame | None) -> None:
    series = category_series(mem_w)
    by_rank = {r.rank: r for r in rows}
    if not series.empty:
        latest = series.dropna(subset=list(CATEGORIES)).sort_values("step").groupby("rank").last()
        peaks = series.groupby("rank")["activation_bytes"].max()
        for rank, row in latest.iterrows():
            target = by_rank.get(int(rank))
            if target is not None:
                target.param_bytes, target.grad_bytes, target.optimizer_state_bytes = (_int(row[c]) for c in CATEGORIES)
                target.activation_peak_bytes = _int(peaks.get(rank))
    _add_outside_pytorch(by_rank, mem_w, tel_w)


def _add_outside_pytorch(by_rank: dict, mem_w: pd.DataFrame, tel_w: pd.DataFrame | None) -> None:
    """The process's device memory (NVML) minus what PyTorch's allocator reserved (medians over the window):
    the CUDA context, NCCL's buffers, other libraries."""
    if tel_w is None or tel_w.empty or "process_mem_used_bytes" not in tel_w:
        return
    process = tel_w.groupby("rank")["process_mem_used_bytes"].median()
    others = tel_w.groupby("rank")["other_processes_mem_used_bytes"].max()
    reserved = mem_w.groupby("rank")["reserved_bytes"].median()
    for rank, target in by_rank.items():
        used, held = _float(process.get(rank)), _float(reserved.get(rank))
        if used is not None and held is not None:
            target.non_pytorch_bytes = int(max(used - held, 0.0))
        target.other_processes_bytes = _int(others.get(rank))


def _spread(ranks: list[RankMemory]) -> list[CategorySpread]:
    out = []
    for name in (*CATEGORIES, "activation_peak_bytes", "non_pytorch_bytes"):
        known = [(getattr(r, name), r.rank) for r in ranks if getattr(r, name) is not None]
        if len(known) < 2:
            continue
        (low, low_rank), (high, high_rank) = min(known), max(known)
        if high - low > SPREAD_MIN_FRACTION * max(high, 1):
            out.append(CategorySpread(name, high_rank, int(high), low_rank, int(low)))
    return sorted(out, key=lambda c: c.max_bytes - c.min_bytes, reverse=True)


def memory_metric(mem: pd.DataFrame) -> str:
    """The reading memory is followed by: CUDA allocated bytes when any were recorded, else the process RSS."""
    return "allocated_bytes" if mem["allocated_bytes"].notna().any() else "rss_bytes"


def oom_steps(events: pd.DataFrame, mem: pd.DataFrame) -> pd.DataFrame:
    """rank, step of each out-of-memory error: ``oom`` events, and steps where a rank's memory.csv OOM counter
    grew (its first reading counts from zero). One row per (rank, step)."""
    parts = []
    if not events.empty and "kind" in events:
        ooms = events[events["kind"] == "oom"]
        if len(ooms) and "step" in ooms:
            parts.append(ooms[["rank", "step"]])
    if not mem.empty and mem["ooms"].notna().any():
        mem = mem.sort_values(["rank", "step"])
        counter = mem["ooms"].astype("float64")
        grew = counter.groupby(mem["rank"]).diff().fillna(counter) > 0
        parts.append(mem.loc[grew, ["rank", "step"]])
    if not parts:
        return pd.DataFrame(columns=["rank", "step"])
    return pd.concat(parts, ignore_index=True).drop_duplicates().astype("float64").astype("int64")


def memory_pressure(report: MemoryReport) -> dict[int, str]:
    """Rank -> what singles out its memory (a suspected leak, allocator retries), where that holds on at most
    half the ranks (one of two ranks included): the straggler analysis names memory as the cause of such a slow
    rank's extra compute. A condition most ranks share (the same leak everywhere) says nothing about why one
    rank is slower."""
    ranks = report.per_rank
    leaking = {r.rank: r for r in ranks if r.leak_suspected and r.growth_bytes_per_step}
    retrying = {r.rank: r for r in ranks if r.alloc_retries}
    out = {}
    if 2 * len(retrying) <= len(ranks):
        for rank, r in retrying.items():
            out[rank] = f"its caching allocator retried {r.alloc_retries} times (freeing its cache near the limit)"
    if 2 * len(leaking) <= len(ranks):
        for rank, r in leaking.items():
            out[rank] = f"its {r.metric} grows {r.growth_bytes_per_step / 2**20:.2f} MiB/step (leak suspected)"
    return out


def _growth(mem_w: pd.DataFrame, metric: str) -> dict[int, tuple[float, float]]:
    """Per rank least-squares slope (bytes per step) and r² of ``metric`` against the step, vectorised."""
    frame = pd.DataFrame(
        {"rank": mem_w["rank"], "x": mem_w["step"].astype("float64"), "y": mem_w[metric].astype("float64")}
    ).dropna()
    if frame.empty:
        return {}
    frame["x"] -= frame.groupby("rank")["x"].transform("mean")
    frame["y"] -= frame.groupby("rank")["y"].transform("mean")
    frame["xy"], frame["xx"], frame["yy"] = frame["x"] * frame["y"], frame["x"] ** 2, frame["y"] ** 2
    sums = frame.groupby("rank")[["xy", "xx", "yy"]].sum()
    out = {}
    for rank, (sxy, sxx, syy) in sums.iterrows():
        if sxx <= 0:
            continue
        slope = sxy / sxx
        r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
        out[int(rank)] = (float(slope), float(r2))
    return out


def _int(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _float(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


# -- findings --------------------------------------------------------------------------------------------------
def memory_findings(mem: MemoryReport, ctx: FindingContext) -> list[Finding]:
    out = []
    leaks = [r for r in mem.per_rank if r.leak_suspected]
    if leaks:
        evidence = [
            f"rank {r.rank}: {r.metric} grows {r.growth_bytes_per_step / 2**20:.2f} MiB/step (r²={r.growth_r2:.2f})"
            + (f", OOM in ~{r.steps_to_oom:.0f} steps" if r.steps_to_oom is not None else "")
            for r in leaks[:10]
        ]
        soon = any(r.steps_to_oom is not None and r.steps_to_oom < 100_000 for r in leaks)
        out.append(
            Finding(
                "memory_leak",
                "high" if soon else "medium",
                f"Memory grows steadily on {ranks_text([r.rank for r in leaks])} (leak suspected)",
                [r.rank for r in leaks],
                0.0,
                0.0,
                evidence,
                "Look for tensors kept across steps (losses appended without .item(), caches, hooks holding graphs); torch.cuda.memory._record_memory_history shows who allocates.",
            )
        )
    near = [r for r in mem.per_rank if r.near_oom]
    if near:
        evidence = [
            f"rank {r.rank}: peak reserved {r.peak_reserved_bytes / 2**30:.1f} GiB of {r.device_total_bytes / 2**30:.1f} GiB ({r.headroom_pct:.0f}% free)"
            for r in near[:10]
        ] + _deep_evidence(mem, [r.rank for r in near])
        out.append(
            Finding(
                "memory_headroom",
                "medium",
                f"{len(near)} rank(s) close to out-of-memory",
                [r.rank for r in near],
                0.0,
                0.0,
                evidence,
                "Reduce micro-batch or activation memory (activation checkpointing), or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
            )
        )
    retries = [r for r in mem.per_rank if r.alloc_retries]
    if retries:
        evidence = [
            f"rank {r.rank}: {r.alloc_retries} cudaMalloc retries, fragmentation {r.fragmentation_pct or 0:.0f}%"
            for r in retries[:10]
        ]
        out.append(
            Finding(
                "allocator_retries",
                "medium",
                f"The caching allocator had to free its cache and retry on {len(retries)} rank(s)",
                [r.rank for r in retries],
                0.0,
                0.0,
                evidence,
                "Each retry synchronises the device; use expandable_segments:True or lower peak memory.",
            )
        )
    ooms = [r for r in mem.per_rank if r.ooms]
    if ooms or mem.ooms:
        ranks = sorted({r.rank for r in ooms} | {o.rank for o in mem.ooms})
        evidence = [line for o in mem.ooms[:3] for line in oom_evidence(o)] or [
            f"rank {r.rank}: {r.ooms} OOMs" for r in ooms[:10]
        ]
        evidence += _deep_evidence(mem, ranks)
        advice = "; ".join(_advice_text(a) for a in mem.ooms[0].advice[:3]) if mem.ooms else ""
        out.append(
            Finding(
                "oom",
                "high",
                f"Out-of-memory errors on {ranks_text(ranks)}",
                ranks,
                0.0,
                0.0,
                evidence,
                advice or "See the rank's events.jsonl and memory summary for what held the memory.",
            )
        )
    return out


def _deep_evidence(mem: MemoryReport, ranks: list[int]) -> list[str]:
    """What the deep mode found behind the peak of the first two of ``ranks`` that ran it (none: no lines)."""
    from diag.analysis.memory_deep import deep_lines

    chosen = [d for d in mem.deep if d.rank in set(ranks)][:2]
    return [line for d in chosen for line in deep_lines(d, byte_text)]


def oom_evidence(oom: OomExplanation) -> list[str]:
    """An OOM explanation in a few lines: the verdict, what held the memory, how the rank differs."""
    where = f"rank {oom.rank}" + (f" step {oom.step}" if oom.step is not None else "")
    lines = [f"{where}: {oom.verdict}"]
    held = [
        (label, value)
        for label, value in (
            ("parameters", oom.param_bytes),
            ("gradients", oom.grad_bytes),
            ("optimizer state", oom.optimizer_state_bytes),
            ("activations and temporaries", oom.activation_bytes),
            ("outside PyTorch", oom.non_pytorch_bytes),
            ("other processes", oom.other_processes_bytes),
        )
        if value is not None
    ]
    if held:
        lines.append(f"{where} held " + ", ".join(f"{label} {byte_text(value)}" for label, value in held))
    elif oom.allocated_bytes is not None:
        lines.append(f"{where}: PyTorch had {byte_text(oom.allocated_bytes)} allocated (no categories recorded)")
    if oom.differs_by:
        lines.append(f"{where} differs from the other ranks by " + "; ".join(oom.differs_by[:2]))
    return lines


def _advice_text(advice) -> str:
    frees = f" (frees ~{byte_text(advice.frees_bytes)})" if advice.frees_bytes is not None else ""
    return advice.action + frees


def _memory_json(memory: MemoryReport) -> dict:
    """The deep memory mode's result only from runs that used it."""
    out = json_safe(memory)
    if not memory.deep:
        out.pop("deep", None)
    return {"memory": out}


SECTION = Section("memory", memory_findings, json=_memory_json)
