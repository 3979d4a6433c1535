"""Collectives: which cost most, the bandwidth they reach, and how long each rank waits in them.

The same collective carries the same (process group, seq) on every rank of its group. Its shortest duration
over ranks belongs to the rank that arrived last, and approximates the transfer itself; everything the other
ranks spent beyond it was waiting for that rank. Only durations are compared, so cross-host clock skew does
not matter. Bandwidths follow nccl-tests (github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = S / t with S the buffer size nccl-tests reports (the gathered output for all_gather), and
busbw = algbw x a factor per op that makes it comparable with the link's bandwidth.
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
class CollectiveWaits:
    """Per-row waits of the completed collectives in the window, as flat arrays (tens of millions of rows at
    scale: no DataFrame copies), and one row per collective instance (pg, seq)."""

    rank: np.ndarray  # int32
    step: np.ndarray  # int64
    duration_us: np.ndarray  # float64; NaN where only the issue time is known
    wait_us: np.ndarray  # duration minus the instance's shortest duration, or latest issue minus own issue
    is_last: np.ndarray  # bool: this rank arrived last (shortest duration, or latest issue) at an instance of >1 ranks
    blocking: np.ndarray  # bool: the caller waited in the call (async_op=False)
    instance: np.ndarray  # int64 index into ``instances``
    instances: pd.DataFrame  # pg, seq, op, bytes_max, transfer_us (min duration; NaN if untimed), ranks

    def __len__(self) -> int:
        return len(self.wait_us)


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
    """What the analyses read of CollectiveWaits, reduced partition by partition (diag.analysis.partitioned):
    no per-row arrays, so its size follows ranks x steps and the instances, not the collective records."""

    per_rank_step: pd.Series  # wait_per_rank_step's result
    last_arrivals: np.ndarray  # by rank: rows where the rank arrived last
    rows_per_rank: np.ndarray  # by rank: rows
    groups: list[OpGroup]
    instances: pd.DataFrame  # matched instances: pg, seq, op, bytes_max, transfer_us, ranks (links reads them)
    members: dict[str, list[int]]  # ranks that recorded each group's collectives in the window
    rows: int

    def __len__(self) -> int:
        return self.rows


def collective_waits(
    coll: pd.DataFrame, mask: np.ndarray | None = None, clock_offsets_us: dict[int, float] | None = None
) -> CollectiveWaits | None:
    """Wait of every collective row (``mask`` selects rows, e.g. the window) for the last rank to arrive.

    Timed rows: the row's duration minus the shortest duration of the same (pg, seq), the transfer once
    everyone was there. Rows without a duration (DDP's buckets read from gloo's Flight Recorder, functional
    collectives, a collective whose completion was never seen): the latest issue time of the same (pg, seq)
    minus the row's own, on rank 0's clock (``clock_offsets_us``). Every row is kept: a collective without a
    duration still happened, moved its bytes and made ranks wait.
    """
    duration = coll["duration_us"].to_numpy(dtype="float64", na_value=np.nan)
    timed_all = ~np.isnan(duration)
    keep = np.ones(len(coll), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if not keep.any():
        return None
    everything = bool(keep.all())

    def column(values: np.ndarray) -> np.ndarray:  # skip copying tens of millions of rows when all are kept
        return values if everything else values[keep]

    duration = column(duration)
    timed = column(timed_all)
    pg = coll["pg"].astype("category")
    op = coll["op"].astype("category")
    pg_codes = column(pg.cat.codes.to_numpy()).astype("int64")
    op_codes = column(op.cat.codes.to_numpy())
    seq = column(coll["seq"].to_numpy(dtype="int64"))
    rank = column(coll["rank"].to_numpy(dtype="int32"))
    # Point-to-point ops are numbered per rank (Flight Recorder's p2p counter), so the same number on two
    # ranks need not be the same transfer; like ops of unknown seq (-1) they are not matched across ranks.
    p2p_codes = [i for i, name in enumerate(op.cat.categories) if canonical_op(name) in ("send", "recv")]
    unmatched = np.isin(op_codes, p2p_codes) | (seq < 0)
    if unmatched.any():
        n_pg = int(pg_codes.max()) + 1
        group_key = np.where(unmatched, n_pg, pg_codes)  # one extra group: each such row is its own instance
        seq_key = np.where(unmatched, np.arange(len(seq)), seq)
    else:
        group_key, seq_key = pg_codes, seq
    instance = _instances(group_key, seq_key)
    n_inst = int(instance.max()) + 1
    inst_pg = np.zeros(n_inst, dtype="int64")
    inst_pg[instance] = pg_codes
    inst_seq = np.zeros(n_inst, dtype="int64")
    inst_seq[instance] = seq
    transfer_us = np.full(n_inst, np.inf)
    np.minimum.at(transfer_us, instance[timed], duration[timed])
    transfer_us[np.isinf(transfer_us)] = np.nan  # no rank timed it
    bytes_max = np.zeros(n_inst, dtype="int64")
    np.maximum.at(bytes_max, instance, column(coll["bytes"].to_numpy(dtype="int64")))
    inst_op = np.zeros(n_inst, dtype="int64")
    inst_op[instance] = op_codes  # any row's op: all ranks issue the same one
    ranks = np.bincount(instance, minlength=n_inst)
    wait_us = duration - transfer_us[instance]
    is_last = timed & (wait_us == 0)
    if not timed.all():
        offsets = clock_offsets_us or {}
        start = column(coll["start_us"].to_numpy(dtype="float64", na_value=np.nan))
        start = start - pd.Series(rank).map(offsets).fillna(0.0).to_numpy()
        latest = np.full(n_inst, -np.inf)
        np.maximum.at(latest, instance[~timed], start[~timed])
        wait_us[~timed] = latest[instance[~timed]] - start[~timed]
        is_last[~timed] = wait_us[~timed] == 0
    instances = pd.DataFrame(
        {
            "pg": np.asarray(pg.cat.categories, dtype=object)[inst_pg],
            "seq": inst_seq,
            "op": np.asarray(op.cat.categories, dtype=object)[inst_op],
            "bytes_max": bytes_max,
            "transfer_us": transfer_us,
            "ranks": ranks,
        }
    )
    return CollectiveWaits(
        rank=rank,
        step=column(coll["step"].to_numpy(dtype="int64")),
        duration_us=duration,
        wait_us=np.nan_to_num(wait_us, nan=0.0),
        is_last=is_last & (ranks[instance] > 1),
        blocking=column(coll["blocking"].to_numpy(dtype="int8")) != 0,
        instance=instance,
        instances=instances,
    )


def _instances(group_key: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Dense instance index per row for (group, seq).

    Sequence numbers count up within a group, so a per-group offset gives a dense index without hashing
    tens of millions of keys; sparse numbering (few rows over a wide range) falls back to factorize."""
    group_key = group_key.astype("int64", copy=False)
    n_groups = int(group_key.max()) + 1
    lo = np.full(n_groups, np.iinfo("int64").max)
    hi = np.full(n_groups, np.iinfo("int64").min)
    np.minimum.at(lo, group_key, seq)
    np.maximum.at(hi, group_key, seq)
    span = np.where(hi >= lo, hi - lo + 1, 0)
    if span.sum() > 4 * len(seq):
        return pd.factorize((group_key << 40) | seq, sort=False)[0].astype("int64")
    base = np.concatenate([[0], np.cumsum(span)[:-1]])
    slot = seq - lo[0] if n_groups == 1 else base[group_key] + (seq - lo[group_key])
    used = np.bincount(slot, minlength=int(span.sum())) > 0
    if used.all():
        return slot
    return (np.cumsum(used) - 1)[slot]


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


def analyze_comms(
    waits: CollectiveWaits | ReducedWaits | None, steps_w: pd.DataFrame, pg_sizes: dict[str, int]
) -> CommsReport:
    report = CommsReport()
    report.per_rank = _per_rank(waits, steps_w)
    if len(steps_w):
        least_blocked = steps_w.groupby("step")["comm_wait_us"].min()
        report.exposed_comm_per_step_s = float(least_blocked.median()) / 1e6
    if waits is None:
        report.note = "no collectives recorded in the window"
        return report
    report.collectives = (
        _per_op_reduced(waits, pg_sizes) if isinstance(waits, ReducedWaits) else _per_op(waits, pg_sizes)
    )
    untimed = sum(c.count - c.timed_count for c in report.collectives)
    if untimed:
        total = sum(c.count for c in report.collectives)
        report.note = (
            f"{untimed} of {total} collectives in the window have no duration (DDP's buckets and functional "
            "collectives read from Flight Recorder carry issue times only): their waits for peers come from issue "
            "times, and they have no bandwidth"
        )
    return report


def _per_op(waits: CollectiveWaits, pg_sizes: dict[str, int]) -> list[CollectiveStats]:
    """Every collective per op, group and size; durations and bandwidths over the timed instances."""
    inst = waits.instances.copy()
    inst["op_name"] = inst["op"].astype(str).map(canonical_op)
    inst["bucket"] = size_bucket(inst["bytes_max"].to_numpy())
    inst["pg"] = inst["pg"].astype(str)
    inst["group"] = inst.groupby(["op_name", "pg", "bucket"], sort=False).ngroup().to_numpy()
    row_group = inst["group"].to_numpy()[waits.instance]
    timed_row = ~np.isnan(waits.duration_us)
    stats = []
    for group, members in inst.groupby("group", sort=False):
        rows = row_group == group
        d = waits.duration_us[rows & timed_row]
        op, pg, bucket = members["op_name"].iloc[0], str(members["pg"].iloc[0]), int(members["bucket"].iloc[0])
        n = pg_sizes.get(pg) or int(members["ranks"].max())
        transfer = members["transfer_us"].dropna().to_numpy()
        t50 = float(np.percentile(transfer, 50)) if len(transfer) else None
        b50 = float(np.median(members["bytes_max"]))
        algbw = algbw_size_bytes(op, b50, n) / t50 / 1e3 if t50 else None  # bytes/us = MB/s
        timed_rows, all_rows = int(len(d)), int(rows.sum())
        stats.append(
            CollectiveStats(
                op=op,
                pg=pg,
                size_bucket=bucket_label(bucket),
                size_bucket_min_bytes=bucket,
                pg_size=n,
                count=len(members),
                rows=all_rows,
                bytes_total=int(members["bytes_max"].sum()),
                bytes_median=int(b50),
                timed_count=len(transfer),
                duration_p50_us=float(np.percentile(d, 50)) if len(d) else None,
                duration_p99_us=float(np.percentile(d, 99)) if len(d) else None,
                transfer_p50_us=t50,
                transfer_p99_us=float(np.percentile(transfer, 99)) if len(transfer) else None,
                algbw_gbps=algbw,
                busbw_gbps=algbw * busbw_factor(op, n) if algbw is not None else None,
                wait_total_s=float(waits.wait_us[rows].sum()) / 1e6,
                wait_from=_wait_from(timed_rows, all_rows),
                total_time_s=float(d.sum()) / 1e6 if len(d) else None,
            )
        )
    # what costs most first; collectives known only by issue time by the waits they caused, then their bytes
    return sorted(stats, key=lambda s: (s.total_time_s or 0.0, s.wait_total_s, s.bytes_total), reverse=True)


def _per_op_reduced(waits: ReducedWaits, pg_sizes: dict[str, int]) -> list[CollectiveStats]:
    """``_per_op`` from groups reduced partition by partition: the same figures (percentiles exact, sums in
    another order)."""
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
    return sorted(stats, key=lambda s: (s.total_time_s or 0.0, s.wait_total_s, s.bytes_total), reverse=True)


def _wait_from(timed_rows: int, all_rows: int) -> str:
    if timed_rows == all_rows:
        return "durations"
    return "issue times" if timed_rows == 0 else "durations and issue times"


def wait_per_rank_step(waits: CollectiveWaits | ReducedWaits) -> pd.Series:
    """Time each rank waited for its peers in each step, indexed by (rank, step).

    Blocking collectives run one after the other, so their waits add up. Asynchronous ones (DDP buckets,
    NCCL on GPUs) overlap: all of a step's buckets wait for the same late rank at once, so their largest wait
    is counted, not the sum."""
    if isinstance(waits, ReducedWaits):
        return waits.per_rank_step
    rank_lo, step_lo = int(waits.rank.min()), int(waits.step.min())
    n_steps = int(waits.step.max()) - step_lo + 1
    n_ranks = int(waits.rank.max()) - rank_lo + 1
    cell = (waits.rank.astype("int64") - rank_lo) * n_steps + (waits.step - step_lo)
    blocking_sum = np.bincount(cell[waits.blocking], weights=waits.wait_us[waits.blocking], minlength=n_ranks * n_steps)
    async_max = np.zeros(n_ranks * n_steps)
    np.maximum.at(async_max, cell[~waits.blocking], waits.wait_us[~waits.blocking])
    seen = np.bincount(cell, minlength=n_ranks * n_steps) > 0
    index = pd.MultiIndex.from_arrays(
        [
            np.arange(n_ranks * n_steps)[seen] // n_steps + rank_lo,
            np.arange(n_ranks * n_steps)[seen] % n_steps + step_lo,
        ],
        names=["rank", "step"],
    )
    return pd.Series((blocking_sum + async_max)[seen], index=index)


def _arrivals(waits: CollectiveWaits | ReducedWaits, size: int) -> tuple[np.ndarray, np.ndarray]:
    """By rank (at least ``size`` of them): rows where it arrived last, and rows."""
    if isinstance(waits, ReducedWaits):
        last, rows = waits.last_arrivals, waits.rows_per_rank
    else:
        last = np.bincount(waits.rank, weights=waits.is_last)
        rows = np.bincount(waits.rank)
    grow = max(size - len(rows), 0)
    return np.pad(last.astype("float64"), (0, grow)), np.pad(rows, (0, grow))


def _per_rank(waits: CollectiveWaits | ReducedWaits | None, steps_w: pd.DataFrame) -> list[RankCommWait]:
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
        per_step = wait_per_rank_step(waits).reindex(iteration.index, fill_value=0.0)
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
