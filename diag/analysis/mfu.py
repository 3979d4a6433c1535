"""Model FLOPs utilisation: model FLOPs per step / step time / dense peak FLOP/s of the device and dtype.

FLOPs per step come from ``--flops-per-step``, else the manifest (user-given or torch's FlopCounter), else
none. Peak comes from ``--peak-tflops``, else the manifest, else the datasheet table in ``peaks.py``. The step
time is the wall time of an iteration (data wait + step body), the median rank's in each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis import grid
from diag.analysis.findings import Finding, FindingContext
from diag.analysis.peaks import lookup_peak_tflops, mfu_of
from diag.analysis.section import Section
from diag.trace.manifest import Manifest

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("samples", "tokens")}


def transformer_flops_per_step(
    n_params: float, tokens: float, n_layers: int | None = None, seq_len: int | None = None, d_model: int | None = None
) -> float:
    """6·N·tokens (forward + backward of the weights) plus the attention term 12·L·s·d·tokens when the shape
    is known (PaLM paper, appendix B). ``tokens`` are this rank's tokens in one step."""
    flops = 6.0 * n_params * tokens
    if n_layers and seq_len and d_model:
        flops += 12.0 * n_layers * seq_len * d_model * tokens
    return flops


@dataclass
class RankMfu:
    rank: int
    mfu: float | None
    tflops: float | None  # achieved model TFLOP/s
    peak_tflops: float | None
    flops_per_step: float | None


@dataclass
class MfuReport:
    mean: float | None = None  # over steps of the window
    median: float | None = None
    overall: float | None = None  # total FLOPs / total time / peak
    tflops_per_gpu: float | None = None  # achieved, mean over ranks at the median step time
    step_time_median_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    flops_source: str | None = None  # cli, manifest:user, manifest:flop_counter, or null
    peak_source: str | None = None  # cli, manifest, datasheet table entry, or null
    device: str | None = None
    dtype: str | None = None
    reason: str | None = None  # why MFU is null
    per_rank: list[RankMfu] = field(default_factory=list)
    per_step: list[dict] = field(default_factory=list)  # {step, mfu}


def analyze_mfu(
    times: pd.DataFrame,
    manifests: dict[int, Manifest],
    steps_w: pd.DataFrame,
    flops_override: float | None,
    peak_override: float | None,
    replicas: int,
) -> MfuReport:
    """``times``: rank, step, iteration_us. ``replicas``: ranks sharing one batch (tp·pp·cp) for throughput."""
    report = MfuReport()
    if times.empty:
        report.reason = "no complete steps in the window"
        return report
    step_time_us = grid.per_step(times, "iteration_us")  # times.groupby("step")["iteration_us"].median()
    report.step_time_median_s = float(step_time_us.median()) / 1e6
    window_s = float(step_time_us.sum()) / 1e6
    _throughput(report, steps_w, window_s, replicas)
    ranks = sorted(times["rank"].unique())
    flops, report.flops_source = _flops(ranks, manifests, flops_override)
    peaks, report.peak_source, report.device, report.dtype, peak_reason = _peaks(ranks, manifests, peak_override)
    reasons = []
    if flops is None:
        reasons.append("FLOPs per step unknown: pass --flops-per-step or diag.init(flops_per_step=...)")
    if peaks is None:
        reasons.append(peak_reason)
    if reasons:
        report.reason = "; ".join(reasons)
        return report
    flops_total, peak_total = float(flops.sum()), float(peaks.sum()) * 1e12
    mfu_per_step = mfu_of(flops_total, step_time_us.to_numpy() / 1e6, peak_total)
    report.per_step = [{"step": int(s), "mfu": float(m)} for s, m in zip(step_time_us.index, mfu_per_step, strict=True)]
    report.mean, report.median = float(np.mean(mfu_per_step)), float(np.median(mfu_per_step))
    report.overall = mfu_of(flops_total * len(step_time_us), window_s, peak_total)
    median_s = report.step_time_median_s
    report.tflops_per_gpu = float(flops.mean()) / median_s / 1e12
    for rank, f, p in zip(ranks, flops, peaks, strict=True):
        tflops = float(f) / median_s / 1e12
        report.per_rank.append(RankMfu(int(rank), tflops / p if p else None, tflops, float(p), float(f)))
    return report


def _throughput(report: MfuReport, steps_w: pd.DataFrame, window_s: float, replicas: int) -> None:
    if window_s <= 0:
        return
    for column, attr in (("tokens", "tokens_per_s"), ("samples", "samples_per_s")):
        values = steps_w[column]
        if values.notna().any():
            setattr(report, attr, float(values.sum()) / max(replicas, 1) / window_s)


def per_step_throughput(steps: pd.DataFrame, times: pd.DataFrame | None, replicas: int) -> pd.DataFrame:
    """step, tokens_per_s and samples_per_s of each step in ``times`` (rank, step, iteration_us): the step's
    tokens (samples) over all ranks of ``steps``, counted once per ``replicas`` ranks that share them as
    ``MfuReport.tokens_per_s`` counts them, over the median rank's iteration time. NaN where none were recorded."""
    if steps.empty or times is None:
        return pd.DataFrame(columns=["step", "tokens_per_s", "samples_per_s"])
    iteration_s = times.groupby("step")["iteration_us"].median() / 1e6
    out = pd.DataFrame({"step": iteration_s.index})
    for column in ("tokens", "samples"):
        total = steps.groupby("step")[column].sum(min_count=1).astype("float64") / max(replicas, 1)
        out[f"{column}_per_s"] = (total.reindex(iteration_s.index) / iteration_s.where(iteration_s > 0)).to_numpy()
    return out


def _manifest_column(manifests: dict[int, Manifest], ranks: list[int], name: str) -> pd.Series:
    """A manifest field of each rank (None where a rank has no manifest)."""
    values = [getattr(manifests[r], name) if r in manifests else None for r in ranks]
    return pd.Series(values, index=ranks, dtype="object")


def _flops(ranks: list[int], manifests: dict[int, Manifest], override: float | None):
    if override:
        return pd.Series(float(override), index=ranks), "cli"
    values = pd.to_numeric(_manifest_column(manifests, ranks, "flops_per_step"), errors="coerce")
    if values.isna().all():
        return None, None
    sources = _manifest_column(manifests, ranks, "flops_source").dropna().astype(str).unique()
    values = values.fillna(values.median())  # ranks without a manifest: the others' value
    return values, "manifest:" + (",".join(sources) if len(sources) else "unknown")


def _peaks(ranks: list[int], manifests: dict[int, Manifest], override: float | None):
    names = _manifest_column(manifests, ranks, "device_name")
    dtypes = _manifest_column(manifests, ranks, "dtype")
    device = next((str(n) for n in names.dropna()), None)
    dtype = next((str(d) for d in dtypes.dropna()), None)
    if override:
        return pd.Series(float(override), index=ranks), "cli", device, dtype, ""
    given = pd.to_numeric(_manifest_column(manifests, ranks, "peak_tflops"), errors="coerce")
    if given.notna().all():
        return given, "manifest", device, dtype, ""
    looked_up = [
        lookup_peak_tflops(n if isinstance(n, str) else None, d if isinstance(d, str) else None)
        for n, d in zip(names, dtypes, strict=True)
    ]
    values = pd.Series([lk.tflops for lk in looked_up], index=ranks, dtype="float64")
    values = given.fillna(values)
    if values.isna().any():
        missing = next(lk for lk, v in zip(looked_up, values, strict=True) if pd.isna(v))
        return None, None, device, dtype, missing.reason
    return values, f"table: {looked_up[0].reason}", device, dtype, ""


# -- findings --------------------------------------------------------------------------------------------------
LOW_MFU = 0.25  # below this share of peak, a (low-severity) finding


def mfu_findings(mfu: MfuReport, ctx: FindingContext) -> list[Finding]:
    if mfu.median is None or mfu.median >= LOW_MFU:
        return []
    return [
        Finding(
            "low_mfu",
            "low",
            f"Model FLOPs utilisation is {100 * mfu.median:.0f}% of the {mfu.device or 'device'} peak",
            [],
            0.0,
            0.0,
            [
                f"{mfu.tflops_per_gpu:.1f} TFLOP/s per GPU achieved; peak from {mfu.peak_source}; FLOPs from {mfu.flops_source}"
            ],
            "Once the findings above are fixed: larger micro-batches, fused kernels, torch.compile, bf16.",
        )
    ]


SECTION = Section("mfu", mfu_findings)
