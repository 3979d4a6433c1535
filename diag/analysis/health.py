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

import numpy as np
import pandas as pd

from diag.analysis.findings import Finding, FindingContext, ranks_text
from diag.analysis.section import Section, json_safe
from diag.trace.manifest import Manifest

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("loss", "grad_norm", "param_fingerprint")}

SPIKE_WINDOW_STEPS = 20
SPIKE_MIN_HISTORY = 8  # steps of a rank's own history before a spike can be called
SPIKE_SIGMAS = 6.0
SPIKE_MIN_RELATIVE = 0.05
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
    report = HealthReport()
    report.first_nonfinite = _nonfinite(events)
    values = steps[["rank", "step", "loss", "grad_norm", "param_fingerprint"]] if len(steps) else None
    recorded = values is not None and values[["loss", "grad_norm", "param_fingerprint"]].notna().any().any()
    report.recorded = bool(recorded or report.first_nonfinite)
    if not recorded:
        report.note = None if report.recorded else "no loss, gradient norm or fingerprint recorded (diag.record)"
        return report
    report.spikes = _spikes(values)
    report.departures = [d for name in ("loss", "grad_norm") for d in _departures(values, name)]
    report.divergence, report.fingerprint_steps = _divergence(values, manifests)
    per_step = values.groupby("step")[["loss", "grad_norm"]].median()
    report.per_step = [
        {"step": int(s), "loss_median": _or_none(r["loss"]), "grad_norm_median": _or_none(r["grad_norm"])}
        for s, r in per_step.iterrows()
    ]
    return report


def _or_none(value) -> float | None:
    return None if pd.isna(value) else float(value)


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


def _spikes(values: pd.DataFrame) -> list[LossSpike]:
    """Steps where some rank's loss jumped above its own recent history."""
    hits: dict[int, list[tuple[int, float, float]]] = {}
    for rank, series in values.dropna(subset=["loss"]).groupby("rank"):
        loss = series.sort_values("step").set_index("step")["loss"]
        history = loss.shift(1).rolling(SPIKE_WINDOW_STEPS, min_periods=SPIKE_MIN_HISTORY)
        baseline = history.median()
        mad = (loss.shift(1) - baseline).abs().rolling(SPIKE_WINDOW_STEPS, min_periods=SPIKE_MIN_HISTORY).median()
        spread = np.maximum(MAD_TO_SIGMA * mad, SPIKE_MIN_RELATIVE * baseline.abs())
        spiked = loss > baseline + SPIKE_SIGMAS * spread
        for step in loss.index[spiked.fillna(False).to_numpy()]:
            hits.setdefault(int(step), []).append((int(rank), float(loss[step]), float(baseline[step])))
    spikes = []
    for step, ranks in sorted(hits.items()):
        worst = max(ranks, key=lambda r: r[1] - r[2])
        spikes.append(LossSpike(step, sorted(r for r, _, _ in ranks), worst[1], worst[2]))
    return spikes


def _departures(values: pd.DataFrame, name: str) -> list[Departure]:
    """Ranks whose value sits apart from the other ranks' at the same steps, most of the time."""
    frame = values.dropna(subset=[name])
    per_step = frame.groupby("step")[name]
    ranks_per_step = per_step.transform("count")
    frame = frame[ranks_per_step >= DEPARTURE_MIN_RANKS]
    if frame.empty:
        return []
    median = frame.groupby("step")[name].transform("median")
    mad = (frame[name] - median).abs().groupby(frame["step"]).transform("median")
    spread = np.maximum(np.maximum(MAD_TO_SIGMA * mad, DEPARTURE_MIN_RELATIVE * median.abs()), 1e-12)
    score = ((frame[name] - median).abs() / spread).groupby(frame["rank"]).median()
    out = []
    for rank in score.index[score > DEPARTURE_SCORE]:
        own = frame[frame["rank"] == rank]
        out.append(
            Departure(
                rank=int(rank),
                value_name=name,
                rank_median=float(own[name].median()),
                peers_median=float(frame[frame["rank"] != rank][name].median()),
                score=float(score[rank]),
            )
        )
    return sorted(out, key=lambda d: -d.score)


def _divergence(values: pd.DataFrame, manifests: dict[int, Manifest]) -> tuple[Divergence | None, int]:
    """The first step at which one replica group's fingerprints disagree, and how many steps were compared."""
    prints = values.dropna(subset=["param_fingerprint"])
    if prints.empty:
        return None, 0
    group_of = {r: (m.replica_group or "default") for r, m in manifests.items()}
    prints = prints.assign(group=prints["rank"].map(lambda r: group_of.get(int(r), "default")))
    compared = 0
    for step, at_step in prints.sort_values("step").groupby("step", sort=True):
        for group, members in at_step.groupby("group"):
            if len(members) < 2:
                continue
            compared += 1
            clusters = _clusters(dict(zip(members["rank"].astype(int), members["param_fingerprint"], strict=True)))
            if len(clusters) > 1:
                largest = max(len(c) for c in clusters)
                majorities = [c for c in clusters if len(c) == largest]
                majority = majorities[0] if len(majorities) == 1 else []
                outside = sorted(r for c in clusters if c is not majority for r in c)
                return Divergence(int(step), str(group), outside, sorted(majority)), compared
    return None, compared


def _clusters(fingerprints: dict[int, float]) -> list[list[int]]:
    """Ranks grouped by equal fingerprints (to FINGERPRINT_RELATIVE), largest first."""
    clusters: list[tuple[float, list[int]]] = []
    for rank, value in sorted(fingerprints.items()):
        for centre, ranks in clusters:
            if abs(value - centre) <= FINGERPRINT_RELATIVE * max(abs(centre), abs(value), 1.0):
                ranks.append(rank)
                break
        else:
            clusters.append((value, [rank]))
    return sorted((ranks for _, ranks in clusters), key=len, reverse=True)


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
