"""Training health per rank: the failures that cost no time but waste the run.

From what ``diag.record(loss=..., grad_norm=...)`` gave each step (the ``steps`` table's ``loss`` and
``grad_norm``), the ``nonfinite`` events capture writes when one was NaN or infinite, and the replicas'
``param_fingerprint`` (the sum of a DDP model's parameters every ``fingerprint_every`` steps):

* the first step and rank where a loss or gradient norm was NaN or infinite;
* loss spikes: a rank's loss above its own recent history by more than ``SPIKE_SIGMAS`` robust standard
  deviations (median and MAD of its previous ``SPIKE_WINDOW_STEPS`` steps; the deviation is at least
  ``SPIKE_MIN_RELATIVE`` of the median, so a flat loss does not make noise a spike);
* ranks whose loss or gradient norm departs from their peers' at the same steps (a robust score against the
  other ranks, its median over the rank's steps above ``DEPARTURE_SCORE``; needs three ranks to say which one);
* replica divergence: the first step at which the ranks of one data-parallel group hold different parameters
  (fingerprints that differ by more than ``FINGERPRINT_RELATIVE``), naming the ranks outside the majority.

Every step recorded is used, not only the analysis window: the first NaN is often what ended the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd

from diag.analysis.engine import Shard, no_windows, run_loaded
from diag.analysis.findings import Finding, FindingContext, ranks_text
from diag.analysis.section import Section, json_safe
from diag.analysis.step_values import StepValues, add_values
from diag.trace.manifest import Manifest

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("loss", "grad_norm", "param_fingerprint")}

SPIKE_WINDOW_STEPS = 20
SPIKE_MIN_HISTORY = 8  # steps of a rank's own history before a spike can be called
SPIKE_SIGMAS = 6.0
SPIKE_MIN_RELATIVE = 0.05
SPIKE_LOSSES_AT_ONCE = 64_000  # losses whose 20-step windows are sorted together: ~10 MB
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
DEPARTURE_SCORE = 4.0
DEPARTURE_MIN_RELATIVE = 0.01  # peers within 1% of each other are not told apart
DEPARTURE_MIN_RANKS = 3
FINGERPRINT_RELATIVE = 1e-9  # replicas hold bit-identical parameters; this allows for reduction order only
MAX_LISTED = 10


@dataclass
class NonFinite:
    step: int | None
    rank: int
    value_name: str  # loss or grad_norm
    value: str  # nan, inf, -inf


@dataclass
class LossSpike:
    step: int
    ranks: list[int]
    loss: float  # the highest of the ranks' losses at that step
    baseline: float  # that rank's median over its previous steps


@dataclass
class Departure:
    rank: int
    value_name: str
    rank_median: float
    peers_median: float
    score: float  # median over its steps of |value - peers' median| / robust spread


@dataclass
class Divergence:
    step: int  # the first step whose fingerprints differ
    group: str  # the replica group (process group name)
    ranks: list[int]  # outside the majority (both sides when there is none)
    majority: list[int]


@dataclass
class HealthReport:
    recorded: bool = False  # any loss, gradient norm or fingerprint was recorded
    first_nonfinite: list[NonFinite] = field(default_factory=list)  # earliest first
    spikes: list[LossSpike] = field(default_factory=list)
    departures: list[Departure] = field(default_factory=list)
    divergence: Divergence | None = None
    fingerprint_steps: int = 0  # steps whose replica fingerprints were compared
    per_step: list[dict] = field(default_factory=list)  # {step, loss_median, grad_norm_median}
    note: str | None = None


def analyze_health(steps: pd.DataFrame, events: pd.DataFrame, manifests: dict[int, Manifest]) -> HealthReport:
    """The health report of loaded tables: ``HealthAnalysis`` over every rank at once."""
    (report,) = run_loaded([HealthAnalysis.of(events, manifests)], Shard({"steps": steps}, no_windows()))
    return report


@dataclass(frozen=True)
class HealthAnalysis:
    """The health report over the ranks (diag.analysis.engine), in two stages. Stage 1 maps each rank's steps
    to its spikes (its own history alone), the per-step multisets of every rank's loss and gradient norm, and the
    distinct fingerprints of each replica group at each step. Between the stages, the per-step medians and
    spreads (``DepartureBasis``) and the first step whose fingerprints split (``FirstSplit``); stage 2 scores each
    rank against those and names the ranks on each side of the split. ``nonfinite``: from the events, which the
    caller holds whole."""

    nonfinite: tuple[NonFinite, ...]
    groups: ReplicaGroups
    reads: ClassVar = READS

    @classmethod
    def of(cls, events: pd.DataFrame, manifests: dict[int, Manifest]) -> HealthAnalysis:
        return cls(tuple(_nonfinite(events)), ReplicaGroups.of(manifests))

    def map(self, shard: Shard) -> tuple[dict[int, RankValues], HealthPartial]:
        steps = shard.table("steps")
        if steps.empty:
            return {}, HealthPartial.empty()
        columns = list(READS["steps"])
        left_out = [c for c in columns if c not in steps]  # a load of other columns only: none recorded here
        steps = steps.assign(**dict.fromkeys(left_out, np.nan)) if left_out else steps
        recorded = bool(steps[columns].notna().any().any())
        partial = HealthPartial(
            np.unique(steps["step"].to_numpy(dtype="int64")), recorded, [], {}, Fingerprints.empty()
        )
        if not recorded:
            return {}, partial
        kept = {int(rank): RankValues.of(int(rank), rows, self.groups) for rank, rows in steps.groupby("rank")}
        partial.spikes = _shard_spikes(list(kept.values()))
        partial.values = {name: StepValues.of(rows_of(steps, name)).bounded() for name in VALUE_NAMES}
        partial.prints = Fingerprints.of(kept.values())
        return kept, partial

    def combine(self, a: HealthPartial, b: HealthPartial) -> HealthPartial:
        names = [name for name in VALUE_NAMES if name in a.values or name in b.values]
        values = {name: add_values(a.values.get(name), b.values.get(name)) for name in names}
        return HealthPartial(
            np.union1d(a.steps, b.steps), a.recorded or b.recorded, a.spikes + b.spikes, values, a.prints + b.prints
        )

    def between(self, partial: HealthPartial) -> tuple[tuple, tuple]:
        bases = {name: DepartureBasis.of(partial.values[name]) for name in VALUE_NAMES if name in partial.values}
        split = partial.prints.first_split(self.groups)
        return (partial, bases, split), (bases, split)

    def second(self, own: RankValues, broadcast: tuple) -> RankFindings:
        bases, split = broadcast
        departing = [d for name, basis in bases.items() if (d := basis.departure(own, name)) is not None]
        side = split.side_of(own) if split is not None else None
        return RankFindings(departing, [] if side is None else [(own.rank, side)])

    def combine2(self, *partials: RankFindings) -> RankFindings:
        return RankFindings([d for p in partials for d in p.departing], [s for p in partials for s in p.sides])

    def finish(self, state: tuple, found: RankFindings) -> HealthReport:
        partial, bases, split = state
        report = HealthReport(first_nonfinite=list(self.nonfinite))
        report.recorded = partial.recorded or bool(report.first_nonfinite)
        if not partial.recorded:
            report.note = None if report.recorded else "no loss, gradient norm or fingerprint recorded (diag.record)"
            return report
        report.spikes = _spikes(partial.spikes)
        report.departures = _departures(partial.values, bases, found.departing)
        report.divergence = split.divergence(found.sides) if split is not None else None
        report.fingerprint_steps = partial.prints.compared(split)
        report.per_step = _per_step(partial)
        return report


def _nonfinite(events: pd.DataFrame) -> list[NonFinite]:
    if events.empty or "kind" not in events:
        return []
    found = events[events["kind"] == "nonfinite"]
    if found.empty:
        return []
    # within a step a loss comes before a gradient norm: a NaN loss on one rank makes every rank's gradient
    # norm NaN through the all-reduce, and the loss is the one that names where it started
    found = found.assign(
        order=pd.to_numeric(found.get("step"), errors="coerce").fillna(np.inf),
        after_loss=found.get("value_name") != "loss",
    )
    out = []
    for _, e in found.sort_values(["order", "after_loss", "rank"]).head(MAX_LISTED).iterrows():
        step = e.get("step")
        out.append(
            NonFinite(
                step=None if pd.isna(step) else int(step),
                rank=int(e["rank"]),
                value_name=str(e.get("value_name")),
                value=str(e.get("value")),
            )
        )
    return out


VALUE_NAMES = ("loss", "grad_norm")


@dataclass(frozen=True)
class ReplicaGroups:
    """Each rank's replica group (``manifest.replica_group``; "default" without one) as codes numbered in the
    groups' sorted order, the order fingerprints are compared in: a small array to send to every worker."""

    names: tuple[str, ...]
    codes: np.ndarray  # by rank; ranks beyond it are in "default"

    @classmethod
    def of(cls, manifests: dict[int, Manifest]) -> ReplicaGroups:
        named = {int(r): m.replica_group or "default" for r, m in manifests.items()}
        names = tuple(sorted({*named.values(), "default"}))
        codes = np.full(max(named, default=-1) + 1, names.index("default"), dtype="int32")
        for rank, name in named.items():
            codes[rank] = names.index(name)
        return cls(names, codes)

    def code(self, rank: int) -> int:
        return int(self.codes[rank]) if rank < len(self.codes) else self.names.index("default")


@dataclass
class RankValues:
    """One rank's recorded values by step (NaN where it recorded none), its state between the stages."""

    rank: int
    group: int  # its ReplicaGroups code
    steps: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    param_fingerprint: np.ndarray

    @classmethod
    def of(cls, rank: int, rows: pd.DataFrame, groups: ReplicaGroups) -> RankValues:
        values = {
            name: rows[name].to_numpy(dtype="float64", na_value=np.nan) for name in (*VALUE_NAMES, "param_fingerprint")
        }
        return cls(rank, groups.code(rank), rows["step"].to_numpy(dtype="int64"), **values)

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The steps and values of ``name`` it recorded (NaN left out)."""
        values = getattr(self, name)
        keep = ~np.isnan(values)
        return self.steps[keep], values[keep]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.steps, self.loss, self.grad_norm, self.param_fingerprint))


def rows_of(steps: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    return steps["step"].to_numpy(dtype="int64"), steps[name].to_numpy(dtype="float64", na_value=np.nan)


def _median(values: np.ndarray) -> float:
    """A Series' median: NaN left out."""
    values = values[~np.isnan(values)]
    return float(np.median(values)) if len(values) else float("nan")


@dataclass
class HealthPartial:
    """Some ranks' health: their steps, whether any value was recorded, their spikes (step, rank, loss,
    baseline), the multisets of their values by step and their fingerprints."""

    steps: np.ndarray
    recorded: bool
    spikes: list[tuple[int, int, float, float]]
    values: dict[str, StepValues]
    prints: Fingerprints

    @classmethod
    def empty(cls) -> HealthPartial:
        return cls(np.zeros(0, dtype="int64"), False, [], {}, Fingerprints.empty())


@dataclass
class RankFindings:
    """Stage 2's partial: the departing ranks (``Departing``) and each rank's side of the first split."""

    departing: list[Departing]
    sides: list[tuple[int, int]]  # (rank, its cluster in FirstSplit)


@dataclass
class Departing:
    rank: int
    value_name: str
    score: float
    rank_median: float
    steps: np.ndarray  # the steps compared, and its values there: taken out of everyone's for its peers' median
    values: np.ndarray


def _shard_spikes(ranks: list[RankValues]) -> list[tuple[int, int, float, float]]:
    """Steps where some rank's loss jumped above its own recent history, as many ranks at a time as keep their
    windows within SPIKE_LOSSES_AT_ONCE losses (a few dozen ranks of 1,000 steps, one of a very long run)."""
    longest = max((len(own.steps) for own in ranks), default=1)
    at_once = max(1, SPIKE_LOSSES_AT_ONCE // max(longest, 1))
    hits = []
    for i in range(0, len(ranks), at_once):
        hits += _spikes_of(ranks[i : i + at_once])
    return hits


def _spikes_of(ranks: list[RankValues]) -> list[tuple[int, int, float, float]]:
    """``_shard_spikes`` of a few ranks, as ranks x losses matrices: each rank's losses in step order (NaN left
    out, so its history is its last recorded steps), padded with NaN to the longest."""
    series = [own.series("loss") for own in ranks]
    length = max((len(steps) for steps, _ in series), default=0)
    if not length:
        return []
    loss = np.full((len(ranks), length), np.nan)
    step = np.zeros((len(ranks), length), dtype="int64")
    for row, (steps, values) in enumerate(series):
        order = np.argsort(steps, kind="stable")
        loss[row, : len(steps)], step[row, : len(steps)] = values[order], steps[order]
    previous = np.c_[np.full(len(ranks), np.nan), loss[:, :-1]]
    baseline = _trailing_medians(previous)
    mad = _trailing_medians(np.abs(previous - baseline))
    spread = np.maximum(MAD_TO_SIGMA * mad, SPIKE_MIN_RELATIVE * np.abs(baseline))
    with np.errstate(invalid="ignore"):  # NaN: no history yet, never a spike
        spiked = loss > baseline + SPIKE_SIGMAS * spread
    rows, columns = np.nonzero(spiked)
    return [(int(step[r, c]), ranks[r].rank, float(loss[r, c]), float(baseline[r, c])) for r, c in zip(rows, columns)]


def _trailing_medians(values: np.ndarray) -> np.ndarray:
    """Along each row, the median of the SPIKE_WINDOW_STEPS values ending at each column, NaN and infinities left
    out (as a pandas rolling median: its middle value, or the mean of the middle two); NaN with fewer than
    SPIKE_MIN_HISTORY of them."""
    finite = np.where(np.isinf(values), np.nan, values)
    padded = np.c_[np.full((len(values), SPIKE_WINDOW_STEPS - 1), np.nan), finite]
    windows = np.sort(np.lib.stride_tricks.sliding_window_view(padded, SPIKE_WINDOW_STEPS, axis=1), axis=2)
    count = (~np.isnan(windows)).sum(axis=2)  # sorted: NaN last, the values first
    low = np.take_along_axis(windows, np.maximum(count - 1, 0)[..., None] // 2, axis=2)[..., 0]
    high = np.take_along_axis(windows, (count // 2)[..., None], axis=2)[..., 0]
    median = np.where(count % 2 == 1, low, (low + high) / 2)
    return np.where(count >= SPIKE_MIN_HISTORY, median, np.nan)


def _spikes(hits: list[tuple[int, int, float, float]]) -> list[LossSpike]:
    """One LossSpike per step, naming its worst rank's loss and baseline."""
    by_step: dict[int, list[tuple[int, float, float]]] = {}
    for step, rank, loss, baseline in sorted(hits, key=lambda h: (h[0], h[1])):
        by_step.setdefault(step, []).append((rank, loss, baseline))
    spikes = []
    for step, ranks in sorted(by_step.items()):
        worst = max(ranks, key=lambda r: r[1] - r[2])
        spikes.append(LossSpike(step, sorted(r for r, _, _ in ranks), worst[1], worst[2]))
    return spikes


@dataclass(frozen=True)
class DepartureBasis:
    """For one value, the steps where enough ranks recorded it to compare them, each step's median and robust
    spread over the ranks: what each rank is scored against."""

    steps: np.ndarray
    median: np.ndarray
    spread: np.ndarray

    @classmethod
    def of(cls, values: StepValues) -> DepartureBasis:
        steps, totals = values.counts()
        compared = steps[totals >= DEPARTURE_MIN_RANKS]
        kept = values.at(np.isin(values.step, compared))
        _, median = kept.medians()
        centre = median[np.searchsorted(compared, kept.step)]
        with np.errstate(invalid="ignore"):  # an infinite loss at an infinite median: NaN, left out as pandas does
            deviations = StepValues.of((kept.step, np.abs(kept.value - centre)), kept.count)
        mad = np.full(len(compared), np.nan)
        with_mad, mads = deviations.medians()
        mad[np.searchsorted(compared, with_mad)] = mads
        spread = np.maximum(np.maximum(MAD_TO_SIGMA * mad, DEPARTURE_MIN_RELATIVE * np.abs(median)), 1e-12)
        return cls(compared, median, spread)

    def departure(self, own: RankValues, name: str) -> Departing | None:
        """The rank, when its median score over the compared steps is above DEPARTURE_SCORE."""
        steps, values = own.series(name)
        keep = np.isin(steps, self.steps)
        at = np.searchsorted(self.steps, steps[keep])
        with np.errstate(invalid="ignore"):
            score = _median(np.abs(values[keep] - self.median[at]) / self.spread[at])
        if not score > DEPARTURE_SCORE:
            return None
        return Departing(own.rank, name, score, _median(values[keep]), steps[keep], values[keep])


def _departures(
    values_of: dict[str, StepValues], bases: dict[str, DepartureBasis], departing: list[Departing]
) -> list[Departure]:
    """The departing ranks, loss before gradient norm, each by descending score (ties by rank), with the median
    of every other rank's values at the steps compared."""
    out = []
    for name, basis in bases.items():
        values = values_of[name]
        everyone = values.at(np.isin(values.step, basis.steps))
        named = sorted((d for d in departing if d.value_name == name), key=lambda d: d.rank)
        found = [Departure(d.rank, name, d.rank_median, _peers_median(everyone, d), d.score) for d in named]
        out += sorted(found, key=lambda d: -d.score)
    return out


def _peers_median(everyone: StepValues, own: Departing) -> float:
    """The median of every value but the rank's own (each of which is among them), whatever their steps."""
    pooled = StepValues.of((np.zeros(len(everyone.value), dtype="int64"), everyone.value), everyone.count)
    mine_values = everyone.alike(own.steps, own.values)
    mine = StepValues.of((np.zeros(len(mine_values), dtype="int64"), mine_values))
    count = pooled.count.copy()
    count[np.searchsorted(pooled.value, mine.value)] -= mine.count
    left = count > 0
    others = StepValues(pooled.step[left], pooled.value[left], count[left])
    return float(others.medians()[1][0]) if left.any() else float("nan")


@dataclass
class Fingerprints:
    """The distinct fingerprints at each (step, replica group), with how many ranks held each and the lowest of
    them (the order ranks are clustered in), sorted by step, group and value. Two add up as StepValues do."""

    step: np.ndarray
    group: np.ndarray
    value: np.ndarray
    count: np.ndarray
    first_rank: np.ndarray

    @classmethod
    def empty(cls) -> Fingerprints:
        return cls(*(np.zeros(0, dtype=t) for t in ("int64", "int32", "float64", "int64", "int64")))

    @classmethod
    def of(cls, ranks) -> Fingerprints:
        step, value, group, rank = [np.zeros(0, "int64")], [np.zeros(0)], [np.zeros(0, "int32")], [np.zeros(0, "int64")]
        for own in ranks:
            steps, values = own.series("param_fingerprint")
            step.append(steps)
            value.append(values)
            group.append(np.full(len(steps), own.group, dtype="int32"))
            rank.append(np.full(len(steps), own.rank, dtype="int64"))
        step, value, group, rank = (np.concatenate(parts) for parts in (step, value, group, rank))
        return cls._distinct(step, group, value, np.ones(len(step), dtype="int64"), rank)

    @classmethod
    def _distinct(cls, step, group, value, count, first_rank) -> Fingerprints:
        order = np.lexsort((value, group, step))
        step, group, value, count, first_rank = (a[order] for a in (step, group, value, count, first_rank))
        if len(step):
            new = (step[1:] != step[:-1]) | (group[1:] != group[:-1]) | (value[1:] != value[:-1])
            starts = np.flatnonzero(np.r_[True, new])
            count, first_rank = np.add.reduceat(count, starts), np.minimum.reduceat(first_rank, starts)
            step, group, value = step[starts], group[starts], value[starts]
        return cls(step, group, value, count, first_rank)

    def __add__(self, other: Fingerprints) -> Fingerprints:
        return Fingerprints._distinct(
            *(np.r_[getattr(self, f), getattr(other, f)] for f in ("step", "group", "value", "count", "first_rank"))
        )

    def _cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each (step, group) starts, and how many ranks it holds."""
        if not len(self.step):
            return np.zeros(0, dtype="int64"), np.zeros(0, dtype="int64")
        starts = np.flatnonzero(np.r_[True, (self.step[1:] != self.step[:-1]) | (self.group[1:] != self.group[:-1])])
        return starts, np.add.reduceat(self.count, starts)

    def first_split(self, groups: ReplicaGroups) -> FirstSplit | None:
        """The first (step, group) of at least two ranks whose fingerprints fall in more than one cluster."""
        starts, members = self._cells()
        ends = np.r_[starts[1:], len(self.step)]
        for cell in np.flatnonzero((members >= 2) & (ends - starts > 1)):  # one distinct value: one cluster
            rows = slice(starts[cell], ends[cell])
            by_rank = np.argsort(self.first_rank[rows], kind="stable")
            values, counts = self.value[rows][by_rank], self.count[rows][by_rank]
            cluster = _cluster_of(values)
            if cluster.max() > 0:
                sizes = np.bincount(cluster, weights=counts).astype("int64")
                return FirstSplit(
                    int(self.step[starts[cell]]),
                    int(self.group[starts[cell]]),
                    groups.names[int(self.group[starts[cell]])],
                    values,
                    cluster,
                    sizes,
                    int(cell),
                )
        return None

    def compared(self, split: FirstSplit | None) -> int:
        """(step, group) cells of at least two ranks compared: up to the first split, or all of them."""
        _, members = self._cells()
        compared = members >= 2
        return int(compared[: split.cell + 1].sum() if split is not None else compared.sum())


def _cluster_of(values: np.ndarray) -> np.ndarray:
    """Each value's cluster, values taken in order: the first cluster whose first value is within
    FINGERPRINT_RELATIVE of it, else a new one."""
    centres: list[float] = []
    out = np.zeros(len(values), dtype="int64")
    for i, value in enumerate(values):
        for c, centre in enumerate(centres):
            if abs(value - centre) <= FINGERPRINT_RELATIVE * max(abs(centre), abs(value), 1.0):
                out[i] = c
                break
        else:
            out[i] = len(centres)
            centres.append(value)
    return out


@dataclass(frozen=True)
class FirstSplit:
    """The first step and replica group whose fingerprints disagree: its distinct values, each one's cluster, and
    the clusters' sizes in ranks."""

    step: int
    group: int
    group_name: str
    values: np.ndarray
    cluster: np.ndarray
    sizes: np.ndarray
    cell: int  # its index among the (step, group) cells

    def side_of(self, own: RankValues) -> int | None:
        """The rank's cluster, when it is in this group and recorded a fingerprint at this step (its last)."""
        if own.group != self.group:
            return None
        steps, values = own.series("param_fingerprint")
        mine = values[steps == self.step]
        if not len(mine):
            return None
        return int(self.cluster[np.flatnonzero(self.values == mine[-1])[0]])

    def divergence(self, sides: list[tuple[int, int]]) -> Divergence:
        """The ranks outside the largest cluster (every rank, when two are largest), and the majority."""
        by_cluster = [sorted(r for r, c in sides if c == cluster) for cluster in range(len(self.sizes))]
        largest = self.sizes.max()
        majority = by_cluster[int(np.argmax(self.sizes))] if (self.sizes == largest).sum() == 1 else []
        majority_cluster = int(np.argmax(self.sizes)) if majority else -1
        outside = sorted(r for c, ranks in enumerate(by_cluster) if c != majority_cluster for r in ranks)
        return Divergence(self.step, self.group_name, outside, majority)


def _per_step(partial: HealthPartial) -> list[dict]:
    """Every step of the steps table, with the median over the ranks of each value (None where none)."""
    medians = {}
    for name in VALUE_NAMES:
        steps, median = partial.values[name].medians() if name in partial.values else (np.zeros(0, "int64"), None)
        medians[name] = dict(zip(steps.tolist(), median.tolist())) if median is not None else {}
    return [
        {
            "step": int(s),
            "loss_median": _or_none(medians["loss"].get(s)),
            "grad_norm_median": _or_none(medians["grad_norm"].get(s)),
        }
        for s in partial.steps.tolist()
    ]


def _or_none(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


# -- findings --------------------------------------------------------------------------------------------------


def health_findings(report: HealthReport, ctx: FindingContext | None = None) -> list[Finding]:
    out = []
    if report.first_nonfinite:
        first = report.first_nonfinite[0]
        where = f"step {first.step}" if first.step is not None else "a step"
        out.append(
            _risk(
                "nonfinite",
                "high",
                f"{first.value_name} became {first.value} first on rank {first.rank} at {where}",
                sorted({n.rank for n in report.first_nonfinite}),
                [f"rank {n.rank}, step {n.step}: {n.value_name} = {n.value}" for n in report.first_nonfinite],
                "Look at that rank's batch at that step and the steps before it (a bad sample, an overflow in "
                "fp16/bf16, a learning-rate spike); torch.autograd.set_detect_anomaly on a rerun of that step "
                "names the operation; gradient clipping and loss scaling keep one bad batch from ending the run.",
            )
        )
    if report.divergence is not None:
        d = report.divergence
        who = ranks_text(d.ranks)
        against = f"the other {len(d.majority)} ranks of group {d.group}" if d.majority else f"each other ({d.group})"
        out.append(
            _risk(
                "replica_divergence",
                "high",
                f"Data-parallel replicas diverged at step {d.step}: {who} hold different parameters from {against}",
                d.ranks,
                [
                    f"parameter fingerprints (float64 sum) compared at {report.fingerprint_steps} steps; "
                    f"first difference at step {d.step}"
                ],
                "Replicas must stay identical: look for a rank that skipped or changed its gradient all-reduce "
                "(no_sync, a conditional backward), a different random seed with broadcast_buffers=False, "
                "non-deterministic parameter updates on one rank, or a faulty GPU (silent data corruption).",
            )
        )
    for spike in report.spikes[:3]:
        out.append(
            _risk(
                "loss_spike",
                "medium",
                f"Loss spiked at step {spike.step} on {ranks_text(spike.ranks)}: {spike.loss:.4g} against a recent "
                f"median of {spike.baseline:.4g}",
                spike.ranks,
                [
                    f"above the rank's previous {SPIKE_WINDOW_STEPS} steps' median by more than {SPIKE_SIGMAS:g} "
                    "robust standard deviations"
                ],
                "One rank: look at its batch at that step (a bad sample) or its GPU; every rank: the learning-rate "
                "schedule or the data order at that step.",
            )
        )
    for departure in report.departures[:3]:
        out.append(
            _risk(
                "rank_departs",
                "medium",
                f"Rank {departure.rank}'s {departure.value_name} departs from its peers': median "
                f"{departure.rank_median:.4g} against {departure.peers_median:.4g}",
                [departure.rank],
                [f"robust score {departure.score:.1f} (above {DEPARTURE_SCORE:g} counts)"],
                "Under data parallelism every rank's gradient norm is the same after the all-reduce and losses "
                "differ only by batch: a rank apart from the others sees other data, another model state or a "
                "faulty device.",
            )
        )
    return out


def _risk(kind: str, severity: str, title: str, ranks: list[int], evidence: list[str], advice: str) -> Finding:
    return Finding(kind, severity, title, ranks, 0.0, 0.0, evidence, advice)


def _health_json(health: HealthReport) -> dict:
    """Only from runs that recorded loss, gradient norms or fingerprints."""
    return {"health": json_safe(health)} if health.recorded else {}


SECTION = Section("health", health_findings, json=_health_json)
