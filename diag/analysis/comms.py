"""Collectives: which cost most, the bandwidth they reach, and how long each rank waits in them.

The same collective carries the same (process group, seq) on every rank of its group. Its shortest duration
over ranks belongs to the rank that arrived last, and approximates the transfer itself; everything the other
ranks spent beyond it was waiting for that rank. Only durations are compared, so cross-host clock skew does
not matter. diag.analysis.collective_waits computes these waits rank by rank into ``ReducedWaits``. Bandwidths
follow nccl-tests (github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): algbw = S / t with S the
buffer size nccl-tests reports (the gathered output for all_gather), and busbw = algbw x a factor per op that
makes it comparable with the link's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.findings import Finding, FindingContext, severity_for
from diag.analysis.section import Section
from diag.analysis.stragglers import Cause

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("start_us", "duration_us", "data_wait_us", "comm_wait_us")}

# (substring in the op name, canonical op), first match wins: reduce_scatter before reduce, all_reduce too.
_OP_NAMES = (
    ("reduce_scatter", "reduce_scatter"),
    ("reducescatter", "reduce_scatter"),
    ("all_reduce", "all_reduce"),
    ("allreduce", "all_reduce"),
    ("all_gather", "all_gather"),
    ("allgather", "all_gather"),
    ("all_to_all", "all_to_all"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("barrier", "barrier"),
    ("send", "send"),
    ("recv", "recv"),
)


def canonical_op(op: str) -> str:
    low = str(op).lower()
    for needle, name in _OP_NAMES:
        if needle in low:
            return name
    return low


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for ``op`` over ``n`` ranks."""
    if n <= 1:
        return 1.0
    op = canonical_op(op)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw_size_bytes(op: str, input_bytes: float, n: int) -> float:
    """Size S nccl-tests divides by time: all_gather reports the gathered output (n x input)."""
    return input_bytes * n if canonical_op(op) == "all_gather" else input_bytes


def size_bucket(nbytes: np.ndarray) -> np.ndarray:
    """Lower edge of the power-of-two bucket of each size (0 for empty)."""
    nbytes = np.asarray(nbytes, dtype="float64")
    out = np.zeros(len(nbytes), dtype="int64")
    positive = nbytes > 0
    out[positive] = (2 ** np.floor(np.log2(nbytes[positive]))).astype("int64")
    return out


def bucket_label(low_bytes: int) -> str:
    if low_bytes <= 0:
        return "0B"
    return f"{_human_bytes(low_bytes)}-{_human_bytes(low_bytes * 2)}"


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g}{unit}"
        n /= 1024
    return f"{n:g}TiB"


@dataclass
class ValueCounts:
    """A multiset of numbers as sorted distinct values and their counts: exact percentiles and sums over many
    rows in the memory of their distinct values (durations in whole microseconds repeat a lot)."""

    values: np.ndarray  # float64, ascending, distinct
    counts: np.ndarray  # int64

    @classmethod
    def of(cls, values: np.ndarray) -> ValueCounts:
        distinct, counts = np.unique(np.asarray(values, dtype="float64"), return_counts=True)
        return cls(distinct, counts.astype("int64"))

    @classmethod
    def merged(cls, parts: list[ValueCounts]) -> ValueCounts:
        parts = [p for p in parts if len(p.values)]
        if len(parts) <= 1:
            return parts[0] if parts else cls(np.zeros(0), np.zeros(0, dtype="int64"))
        values = np.concatenate([p.values for p in parts])
        counts = np.concatenate([p.counts for p in parts])
        distinct, where = np.unique(values, return_inverse=True)
        return cls(distinct, np.bincount(where, weights=counts, minlength=len(distinct)).astype("int64"))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def sum(self) -> float:
        return float(np.dot(self.values, self.counts))

    def percentile(self, q: float) -> float:
        """``np.percentile(rows, q)`` (linear interpolation, numpy's own lerp) without the rows."""
        n = self.total
        position = q / 100 * (n - 1)
        low = int(np.floor(position))
        t = position - low
        ends = np.cumsum(self.counts)
        a = self.values[np.searchsorted(ends, low, side="right")]
        b = self.values[np.searchsorted(ends, min(low + 1, n - 1), side="right")]
        return float(b - (b - a) * (1 - t)) if t >= 0.5 else float(a + (b - a) * t)


@dataclass
class OpGroup:
    """One (op, process group, size bucket) of the comms table, reduced from its rows and instances."""

    op: str
    pg: str
    bucket: int
    count: int = 0  # instances
    ranks_max: int = 0
    transfer: ValueCounts | None = None  # per timed instance: its shortest duration
    bytes_max: ValueCounts | None = None  # per instance
    durations: ValueCounts | None = None  # per timed row
    rows: int = 0
    wait_sum_us: float = 0.0


@dataclass
class ReducedWaits:
    """What the analyses read of the collectives' waits for the last rank, reduced rank by rank
    (diag.analysis.collective_waits, over the ranks' files or a loaded table): no per-row arrays, so its size follows
    ranks x steps and the instances, not the collective records."""

    # wait for peers by (rank, step): blocking collectives run one after the other, so their waits add up;
    # asynchronous ones (DDP buckets, NCCL on GPUs) overlap, all of a step's waiting for the same late rank at
    # once, so their largest wait counts, not the sum
    per_rank_step: pd.Series | None  # None once the step times and the communication report have read it
    last_arrivals: np.ndarray  # by rank: rows where the rank arrived last
    rows_per_rank: np.ndarray  # by rank: rows
    groups: list[OpGroup]
    instances: pd.DataFrame  # matched instances: pg, seq, op, bytes_max, transfer_us, ranks (links reads them)
    members: dict[str, list[int]]  # ranks that recorded each group's collectives in the window
    rows: int

    def __len__(self) -> int:
        return self.rows


@dataclass
class CollectiveStats:
    op: str
    pg: str
    size_bucket: str
    size_bucket_min_bytes: int
    pg_size: int
    count: int  # collective instances (one per (pg, seq), whatever the number of ranks)
    rows: int  # per-rank records
    bytes_total: int  # summed over instances, per rank's input (bytes one rank contributes)
    bytes_median: int
    timed_count: int  # instances with a duration on at least one rank; the others are known by issue time
    duration_p50_us: float | None  # per-rank durations (issue to completion: includes waiting for peers)
    duration_p99_us: float | None
    transfer_p50_us: float | None  # shortest duration per instance: the transfer once everyone arrived
    transfer_p99_us: float | None
    algbw_gbps: float | None  # at transfer_p50_us
    busbw_gbps: float | None
    wait_total_s: float  # time ranks spent waiting for the last rank in these collectives, summed over rows
    wait_from: str  # "durations", "issue times" or "durations and issue times"
    total_time_s: float | None  # summed per-rank durations of the timed rows; None when none is timed


@dataclass
class RankCommWait:
    rank: int
    wait_for_peers_s: float  # in collectives, beyond the transfer: waiting for the last rank (per step: blocking
    # waits added, overlapping asynchronous ones counted once, at most the step)
    blocked_in_comm_s: float  # steps.csv comm_wait_us: host time blocked in synchronous collectives
    step_time_s: float  # data wait + step body over the window
    wait_share_pct: float  # wait_for_peers_s / step_time_s
    blocked_share_pct: float
    last_arrival_fraction: float  # share of its collectives where this rank arrived last


@dataclass
class CommsReport:
    collectives: list[CollectiveStats] = field(default_factory=list)  # sorted by total time, largest first
    per_rank: list[RankCommWait] = field(default_factory=list)
    exposed_comm_per_step_s: float | None = None  # median over steps of the least any rank was blocked
    note: str | None = None


def analyze_comms(waits: ReducedWaits | None, steps_w: pd.DataFrame, pg_sizes: dict[str, int]) -> CommsReport:
    report = CommsReport()
    report.per_rank = _per_rank(waits, steps_w)
    if len(steps_w):
        least_blocked = steps_w.groupby("step")["comm_wait_us"].min()
        report.exposed_comm_per_step_s = float(least_blocked.median()) / 1e6
    if waits is None:
        report.note = "no collectives recorded in the window"
        return report
    report.collectives = _per_op(waits, pg_sizes)
    untimed = sum(c.count - c.timed_count for c in report.collectives)
    if untimed:
        total = sum(c.count for c in report.collectives)
        report.note = (
            f"{untimed} of {total} collectives in the window have no duration (DDP's buckets and functional "
            "collectives read from Flight Recorder carry issue times only): their waits for peers come from issue "
            "times, and they have no bandwidth"
        )
    return report


def _per_op(waits: ReducedWaits, pg_sizes: dict[str, int]) -> list[CollectiveStats]:
    """Every collective per op, group and size; durations and bandwidths over the timed instances."""
    stats = []
    for g in waits.groups:
        n = pg_sizes.get(g.pg) or g.ranks_max
        transfer, durations, sizes = g.transfer, g.durations, g.bytes_max
        t50 = transfer.percentile(50) if transfer.total else None
        b50 = sizes.percentile(50)
        algbw = algbw_size_bytes(g.op, b50, n) / t50 / 1e3 if t50 else None
        timed_rows = durations.total
        stats.append(
            CollectiveStats(
                op=g.op,
                pg=g.pg,
                size_bucket=bucket_label(g.bucket),
                size_bucket_min_bytes=g.bucket,
                pg_size=n,
                count=g.count,
                rows=g.rows,
                bytes_total=int(round(sizes.sum())),
                bytes_median=int(b50),
                timed_count=transfer.total,
                duration_p50_us=durations.percentile(50) if timed_rows else None,
                duration_p99_us=durations.percentile(99) if timed_rows else None,
                transfer_p50_us=t50,
                transfer_p99_us=transfer.percentile(99) if transfer.total else None,
                algbw_gbps=algbw,
                busbw_gbps=algbw * busbw_factor(g.op, n) if algbw is not None else None,
                wait_total_s=g.wait_sum_us / 1e6,
                wait_from=_wait_from(timed_rows, g.rows),
                total_time_s=durations.sum() / 1e6 if timed_rows else None,
            )
        )
    # what costs most first; collectives known only by issue time by the waits they caused, then their bytes
    return sorted(stats, key=lambda s: (s.total_time_s or 0.0, s.wait_total_s, s.bytes_total), reverse=True)


def _wait_from(timed_rows: int, all_rows: int) -> str:
    if timed_rows == all_rows:
        return "durations"
    return "issue times" if timed_rows == 0 else "durations and issue times"


def _arrivals(waits: ReducedWaits, size: int) -> tuple[np.ndarray, np.ndarray]:
    """By rank (at least ``size`` of them): rows where it arrived last, and rows."""
    last, rows = waits.last_arrivals, waits.rows_per_rank
    grow = max(size - len(rows), 0)
    return np.pad(last.astype("float64"), (0, grow)), np.pad(rows, (0, grow))


def _per_rank(waits: ReducedWaits | None, steps_w: pd.DataFrame) -> list[RankCommWait]:
    """Each rank's waits for its peers over the window, as a share of its step time.

    Per step, the waits of overlapping asynchronous collectives (DDP buckets) are counted once, not summed
    (summing them gave shares above 100%), and a step's wait is never more than the rank's iteration in it."""
    if not len(steps_w):
        return []
    iteration = (steps_w["data_wait_us"] + steps_w["duration_us"]).astype("float64")
    iteration.index = pd.MultiIndex.from_arrays([steps_w["rank"], steps_w["step"]], names=["rank", "step"])
    step_time = iteration.groupby(level="rank").sum()
    blocked = steps_w["comm_wait_us"].groupby(steps_w["rank"]).sum().reindex(step_time.index, fill_value=0)
    wait = pd.Series(0.0, index=step_time.index)
    last = np.zeros(len(step_time))
    if waits is not None:
        per_step = waits.per_rank_step.reindex(iteration.index, fill_value=0.0)
        wait = np.minimum(per_step, iteration).groupby(level="rank").sum().reindex(step_time.index, fill_value=0.0)
        size = int(step_time.index.max()) + 1
        last_all, rows_all = _arrivals(waits, size)
        idx = step_time.index.to_numpy()
        last = np.divide(last_all[idx], rows_all[idx], out=np.zeros(len(idx)), where=rows_all[idx] > 0)
    out = []
    for i, (rank, total_us) in enumerate(step_time.items()):
        total_us, wait_us = float(total_us), float(wait[rank])
        out.append(
            RankCommWait(
                rank=int(rank),
                wait_for_peers_s=wait_us / 1e6,
                blocked_in_comm_s=float(blocked[rank]) / 1e6,
                step_time_s=total_us / 1e6,
                wait_share_pct=100 * wait_us / total_us if total_us else 0.0,
                blocked_share_pct=100 * float(blocked[rank]) / total_us if total_us else 0.0,
                last_arrival_fraction=float(last[i]),
            )
        )
    return out


# -- findings --------------------------------------------------------------------------------------------------
EXPOSED_SHARE_MIN = 0.05  # exposed communication / data loading worth a finding


def exposed_time_findings(comms: CommsReport, ctx: FindingContext) -> list[Finding]:
    """Time every rank spends blocked in communication or in its data loader: nobody computes then."""
    times, step_s = ctx.times, ctx.step_s
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


SECTION = Section("comms", exposed_time_findings)
