"""GPU telemetry (NVML samples) per GPU, tied to the rank that used it: throttling, heat, idleness, errors.

Only the reasons that slow a busy GPU down count as throttling: software power cap, hardware slowdown,
thermal slowdowns and power brake. ``gpu_idle`` and the application-clock setting are not problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import pandas as pd

from diag.analysis.engine import Shard
from diag.analysis.findings import Finding, FindingContext
from diag.analysis.section import Section, json_safe
from diag.analysis.stragglers import Cause
from diag.trace.schema import THROTTLE_REASONS

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {
    "telemetry": (
        "time_us",
        "gpu",
        "util_pct",
        "power_w",
        "power_limit_w",
        "temp_c",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "throttle_reasons",
        "ecc_corrected",
        "ecc_uncorrected",
        "xid",
    )
}

SLOWING_REASONS = {
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}
# the bits of NVML's clock-event reasons (``THROTTLE_REASONS``) that count as throttling
SLOWING_MASK = sum(bit for bit, name in THROTTLE_REASONS.items() if name in SLOWING_REASONS)
THROTTLED_SHARE = 0.2  # a GPU throttled in this share of its samples is called throttled
HOT_C = 85.0  # sustained temperature where H100/A100 start thermal slowdown (~87-90 C): a warning sign
IDLE_UTIL_PCT = 20.0


@dataclass
class GpuTelemetry:
    rank: int
    gpu: int
    host: str | None
    samples: int
    util_mean_pct: float | None
    sm_clock_mean_mhz: float | None
    sm_clock_max_mhz: float | None
    sm_clock_vs_max_pct: float | None  # mean current SM clock / max SM clock
    power_mean_w: float | None
    power_limit_w: float | None
    power_vs_limit_pct: float | None
    temp_max_c: float | None
    temp_mean_c: float | None
    throttle_share: dict[str, float] = field(default_factory=dict)  # reason -> share of samples with its bit
    throttled_share: float = 0.0  # share of samples with any slowing reason
    ecc_corrected: int = 0  # increase over the window
    ecc_uncorrected: int = 0
    xids: list[int] = field(default_factory=list)
    throttled: bool = False
    hot: bool = False
    idle: bool = False


@dataclass
class TelemetryReport:
    gpus: list[GpuTelemetry] = field(default_factory=list)
    note: str | None = None

    def by_rank(self) -> dict[int, GpuTelemetry]:
        return {g.rank: g for g in self.gpus}


def analyze_telemetry(tel: pd.DataFrame, hosts: dict[int, str]) -> TelemetryReport:
    return TelemetryAnalysis(hosts).finish(gpu_rows(tel))


@dataclass(frozen=True)
class TelemetryAnalysis:
    """The telemetry report over the ranks (diag.analysis.engine): a row per GPU, each from its rank's samples in
    the window alone; ``hosts`` (rank -> host) named in ``finish``."""

    hosts: dict[int, str]
    reads: ClassVar = READS

    def map(self, shard: Shard) -> list[GpuTelemetry]:
        return gpu_rows(shard.telemetry_in_window())

    def combine(self, a: list[GpuTelemetry], b: list[GpuTelemetry]) -> list[GpuTelemetry]:
        return a + b

    def finish(self, gpus: list[GpuTelemetry]) -> TelemetryReport:
        if not gpus:
            return TelemetryReport(note="no GPU telemetry (CPU run, or NVML unavailable)")
        ordered = sorted(gpus, key=lambda g: (g.rank, g.gpu))
        return TelemetryReport(gpus=[replace(g, host=self.hosts.get(g.rank)) for g in ordered])


def gpu_rows(tel: pd.DataFrame) -> list[GpuTelemetry]:
    """One row per (rank, gpu) of the samples ``tel``, its host not yet named."""
    if tel.empty:
        return []
    agg = _aggregate(tel)
    xids = tel.loc[tel["xid"].notna(), ["rank", "gpu", "xid"]].groupby(["rank", "gpu"])["xid"].unique()
    gpus = []
    for (rank, gpu), row in agg.iterrows():
        share = {name: float(row[name]) for name in THROTTLE_REASONS.values() if row[name] > 0}
        clock, clock_max, power, limit = row["clock"], row["clock_max"], row["power"], row["limit"]
        util, temp_max = _opt(row["util"]), _opt(row["temp_max"])
        gpus.append(
            GpuTelemetry(
                rank=int(rank),
                gpu=int(gpu),
                host=None,
                samples=int(row["samples"]),
                util_mean_pct=util,
                sm_clock_mean_mhz=_opt(clock),
                sm_clock_max_mhz=_opt(clock_max),
                sm_clock_vs_max_pct=_opt(100 * clock / clock_max) if clock_max and clock_max > 0 else None,
                power_mean_w=_opt(power),
                power_limit_w=_opt(limit),
                power_vs_limit_pct=_opt(100 * power / limit) if limit and limit > 0 else None,
                temp_max_c=temp_max,
                temp_mean_c=_opt(row["temp_mean"]),
                throttle_share=share,
                throttled_share=float(row["slowing"]),
                ecc_corrected=int(row["ecc_corrected"]),
                ecc_uncorrected=int(row["ecc_uncorrected"]),
                xids=sorted(int(x) for x in xids.get((rank, gpu), [])),
                throttled=float(row["slowing"]) >= THROTTLED_SHARE,
                hot=temp_max is not None and temp_max >= HOT_C,
                idle=util is not None and util < IDLE_UTIL_PCT,
            )
        )
    return gpus


def throttled_samples(throttle_reasons: pd.Series) -> np.ndarray:
    """Per telemetry sample (``throttle_reasons`` bitmasks): True when a reason that slows a busy GPU was set
    (``SLOWING_MASK``). A sample without a reading is not throttled."""
    return (_reason_bits(throttle_reasons) & SLOWING_MASK) != 0


def _reason_bits(throttle_reasons: pd.Series) -> np.ndarray:
    return throttle_reasons.fillna(0).to_numpy(dtype="int64")


def _aggregate(tel: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, gpu): means, maxima, throttle-reason shares and error-counter increases."""
    bits = _reason_bits(tel["throttle_reasons"])
    frame = pd.DataFrame(
        {
            "rank": tel["rank"].to_numpy(),
            "gpu": tel["gpu"].to_numpy(),
            "util": tel["util_pct"].to_numpy(dtype="float64", na_value=np.nan),
            "clock": tel["sm_clock_mhz"].to_numpy(dtype="float64", na_value=np.nan),
            "clock_max": tel["sm_clock_max_mhz"].to_numpy(dtype="float64", na_value=np.nan),
            "power": tel["power_w"].to_numpy(dtype="float64", na_value=np.nan),
            "limit": tel["power_limit_w"].to_numpy(dtype="float64", na_value=np.nan),
            "temp": tel["temp_c"].to_numpy(dtype="float64", na_value=np.nan),
            "ecc_c": tel["ecc_corrected"].to_numpy(dtype="float64", na_value=np.nan),
            "ecc_u": tel["ecc_uncorrected"].to_numpy(dtype="float64", na_value=np.nan),
            "slowing": throttled_samples(tel["throttle_reasons"]),
            **{name: (bits & bit) != 0 for bit, name in THROTTLE_REASONS.items()},
        }
    )
    g = frame.groupby(["rank", "gpu"], sort=True)
    out = g[["util", "clock", "power", "limit", "slowing", *THROTTLE_REASONS.values()]].mean()
    out["clock_max"] = g["clock_max"].max()
    out["temp_max"] = g["temp"].max()
    out["temp_mean"] = g["temp"].mean()
    out["ecc_corrected"] = (g["ecc_c"].max() - g["ecc_c"].min()).fillna(0)
    out["ecc_uncorrected"] = (g["ecc_u"].max() - g["ecc_u"].min()).fillna(0)
    out["samples"] = g.size()
    return out


def _opt(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


# -- findings --------------------------------------------------------------------------------------------------
def telemetry_findings(tel: TelemetryReport, ctx: FindingContext) -> list[Finding]:
    out = []
    explained = {s.rank for s in ctx.stragglers.stragglers if s.cause == Cause.THROTTLE}
    throttled = [g for g in tel.gpus if g.throttled]
    if throttled:
        evidence = [
            f"rank {g.rank} ({g.host}:{g.gpu}): throttled {100 * g.throttled_share:.0f}% of samples "
            f"({', '.join(sorted(g.throttle_share))}), SM clock {g.sm_clock_vs_max_pct or 0:.0f}% of max, max {g.temp_max_c or 0:.0f} C"
            for g in throttled[:10]
        ]
        note = " (its time cost is counted in the straggler finding)" if explained & {g.rank for g in throttled} else ""
        out.append(
            _gpu_finding(
                "gpu_throttle",
                "medium",
                f"{len(throttled)} GPU(s) throttled{note}",
                throttled,
                evidence,
                Cause.THROTTLE.advice,
            )
        )
    errors = [g for g in tel.gpus if g.ecc_uncorrected or g.xids]
    if errors:
        evidence = [
            f"rank {g.rank} ({g.host}:{g.gpu}): uncorrected ECC +{g.ecc_uncorrected}, XID {g.xids}" for g in errors[:10]
        ]
        out.append(
            _gpu_finding(
                "gpu_error",
                "high",
                f"{len(errors)} GPU(s) reported errors",
                errors,
                evidence,
                "Drain these GPUs/nodes and report them: uncorrected ECC errors and XIDs precede crashes and silent corruption.",
            )
        )
    hot = [g for g in tel.gpus if g.hot and not g.throttled]
    if hot:
        evidence = [f"rank {g.rank} ({g.host}:{g.gpu}): max {g.temp_max_c:.0f} C" for g in hot[:10]]
        out.append(
            _gpu_finding(
                "gpu_hot",
                "low",
                f"{len(hot)} GPU(s) run hot",
                hot,
                evidence,
                "Check airflow and cooling before they throttle.",
            )
        )
    busy = [g for g in tel.gpus if g.util_mean_pct is not None and g.util_mean_pct >= 50]
    idle = [g for g in tel.gpus if g.idle] if busy else []
    if idle:
        evidence = [f"rank {g.rank} ({g.host}:{g.gpu}): utilisation {g.util_mean_pct:.0f}%" for g in idle[:10]]
        out.append(
            _gpu_finding(
                "gpu_idle",
                "medium",
                f"{len(idle)} GPU(s) mostly idle while others are busy",
                idle,
                evidence,
                "These GPUs wait on something else (data, CPU, peers); check their ranks' straggler and data-wait figures.",
            )
        )
    return out


def _gpu_finding(kind, severity, title, gpus, evidence, advice) -> Finding:
    return Finding(
        kind,
        severity,
        title,
        [g.rank for g in gpus],
        0.0,
        0.0,
        evidence,
        advice,
        hosts=sorted({g.host for g in gpus if g.host}),
        gpus=[f"{g.host}:{g.gpu}" for g in gpus],
    )


SECTION = Section(
    "telemetry",
    telemetry_findings,
    json=lambda telemetry: {"telemetry": {"per_gpu": json_safe(telemetry.gpus), "note": telemetry.note}},
)
