"""Findings: the problems worth acting on, ranked by the time each costs the job.

Each analysis module owns its findings (``stragglers.straggler_findings``, ``comms.exposed_time_findings``, ...,
each ``(result, FindingContext) -> list[Finding]``), declared in its ``SECTION``; ``report.SECTIONS`` lists
them. A finding costs ``time_lost_per_step_s`` for every step in the window, ``time_lost_s`` in total. Risks
that cost no time yet (a leak, little headroom) carry 0 s and are ranked after those that do, by severity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # findings.py is imported by every analysis module: it imports none of them
    from diag.analysis.stragglers import RankStepTimes, StragglerReport

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


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


@dataclass(frozen=True)
class FindingContext:
    """What every analysis's findings are graded against."""

    step_s: float | None  # the window's median step time
    steps: int  # steps analysed
    times: RankStepTimes  # per rank and step: busy, waits (stragglers.rank_step_times)
    stragglers: StragglerReport  # a throttled GPU's time is counted in its straggler's finding, not twice


def severity_for(lost_per_step_s: float, step_s: float | None) -> str:
    """The one grading of every finding that costs time: its share of the step."""
    share = lost_per_step_s / step_s if step_s else 0.0
    return "high" if share >= 0.10 else "medium" if share >= 0.03 else "low"


FIRST_KINDS = ("crash", "step_error", "earlier_attempt_failed")  # a run that failed: nothing else matters first


def rank_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (f.kind not in FIRST_KINDS, -round(f.time_lost_s, 6), SEVERITY_ORDER[f.severity], f.kind),
    )


def ranks_text(ranks: list[int], limit: int = 6) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"
