"""Findings: the problems worth acting on, ranked by the time each costs the job.

Each report (stragglers, comms, memory, telemetry, MFU) contributes findings; a finding costs
``time_lost_per_step_s`` for every step in the window, ``time_lost_s`` in total. Risks that cost no time yet
(a leak, little headroom) carry 0 s and are ranked after those that do, by severity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diag.analysis.comms import CommsReport
from diag.analysis.memory import MemoryReport
from diag.analysis.mfu import MfuReport
from diag.analysis.stragglers import Cause, RankStepTimes, Straggler, StragglerReport, joint_saving_us
from diag.analysis.telemetry import TelemetryReport

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
EXPOSED_SHARE_MIN = 0.05  # exposed communication / data loading worth a finding
LOW_MFU = 0.25


@dataclass
class Finding:
    kind: str
    severity: str  # high, medium, low
    title: str
    ranks: list[int]
    time_lost_s: float
    time_lost_per_step_s: float
    evidence: list[str] = field(default_factory=list)
    advice: str = ""
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)  # "host:gpu_index"


def severity_for(lost_per_step_s: float, step_s: float | None) -> str:
    share = lost_per_step_s / step_s if step_s else 0.0
    return "high" if share >= 0.10 else "medium" if share >= 0.03 else "low"


FIRST_KINDS = ("crash", "step_error")  # a run that failed: nothing else matters before that is fixed


def rank_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (f.kind not in FIRST_KINDS, -round(f.time_lost_s, 6), SEVERITY_ORDER[f.severity], f.kind),
    )


def straggler_findings(report: StragglerReport, times: RankStepTimes, step_s: float | None) -> list[Finding]:
    """One finding per cause among persistent stragglers, one for all transient ones.

    Only the slowest rank of a step sets its length, so fixing one straggler helps only down to the next one.
    Causes are credited in a waterfall, worst first: each gets what fixing it saves once the worse ones are
    fixed, and the credits add up to what fixing them all would save."""
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
    who = _ranks_text(ranks)
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


def exposed_time_findings(comms: CommsReport, times: RankStepTimes, step_s: float | None) -> list[Finding]:
    """Time every rank spends blocked in communication or in its data loader: nobody computes then."""
    out = []
    steps = times.frame["step"].nunique()
    if comms.exposed_comm_per_step_s and step_s and comms.exposed_comm_per_step_s >= EXPOSED_SHARE_MIN * step_s:
        per_step = comms.exposed_comm_per_step_s
        top = comms.collectives[:3]
        evidence = [
            f"even the least-blocked rank waits {per_step * 1e3:.1f} ms/step in collectives ({100 * per_step / step_s:.0f}% of the step)"
        ]
        evidence += [
            f"{c.op} on {c.pg} ({c.size_bucket}): {c.count} calls, "
            + (
                f"{c.total_time_s:.2f} s in all, busbw {c.busbw_gbps or 0:.3g} GB/s"
                if c.total_time_s is not None
                else f"untimed (issue times only), {c.wait_total_s:.2f} s waiting for peers"
            )
            for c in top
        ]
        out.append(
            Finding(
                "communication",
                severity_for(per_step, step_s),
                f"Communication not hidden behind compute: {per_step * 1e3:.1f} ms/step on every rank",
                [],
                per_step * steps,
                per_step,
                evidence,
                "Overlap communication with compute (DDP bucket_cap_mb, FSDP prefetching), fewer/larger collectives, "
                "or check that busbw matches the interconnect.",
            )
        )
    least_data_us = times.frame.groupby("step")["data_wait_us"].min()
    if len(least_data_us) and step_s:
        per_step = float(least_data_us.median()) / 1e6
        if per_step >= EXPOSED_SHARE_MIN * step_s:
            out.append(
                Finding(
                    "data_loading",
                    severity_for(per_step, step_s),
                    f"Every rank waits for its data loader: {per_step * 1e3:.1f} ms/step",
                    [],
                    per_step * steps,
                    per_step,
                    [
                        f"the rank waiting least for data still waits {per_step * 1e3:.1f} ms in a median step ({100 * per_step / step_s:.0f}% of it)"
                    ],
                    Cause.DATA.advice,
                )
            )
    return out


def telemetry_findings(tel: TelemetryReport, stragglers: StragglerReport) -> list[Finding]:
    out = []
    explained = {s.rank for s in stragglers.stragglers if s.cause == Cause.THROTTLE}
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


def memory_findings(mem: MemoryReport) -> list[Finding]:
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
                f"Memory grows steadily on {_ranks_text([r.rank for r in leaks])} (leak suspected)",
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
        ]
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
    if ooms:
        out.append(
            Finding(
                "oom",
                "high",
                f"Out-of-memory errors on {_ranks_text([r.rank for r in ooms])}",
                [r.rank for r in ooms],
                0.0,
                0.0,
                [f"rank {r.rank}: {r.ooms} OOMs" for r in ooms[:10]],
                "See the rank's events.jsonl and memory summary for what held the memory.",
            )
        )
    return out


def mfu_findings(mfu: MfuReport) -> list[Finding]:
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


def _ranks_text(ranks: list[int], limit: int = 6) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"
