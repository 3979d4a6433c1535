"""Failures: steps that raised and ranks that ended abnormally, from what capture records.

Capture writes a ``step_error`` (or ``oom``) event when an exception leaves ``diag.step()``, still writes the
failed step's timings (its time was spent), and the watchdog's heartbeat keeps how the process ended
(``exit``: exception with its message, SIGTERM, exit without ``diag.finish``). A failed step's timings say how
long a rank took to fail, not how fast it works: the window leaves such steps out, so they never make a
straggler, and the failures themselves become the run's first finding.

The rank that raised first is seldom the cause: when a rank is late to a collective, the ranks waiting for it
time out and raise first, and it raises last (its peers closed the connection). The finding names the culprit
``diag triage`` names (``judge_failure`` runs triage's verdict on the loaded trace), so both commands blame
the same rank, and says which rank raised first as detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from diag.analysis.findings import Finding, FindingContext
from diag.analysis.section import Section
from diag.trace.manifest import Manifest

ERROR_KINDS = ("step_error", "oom")  # and any event kind ending in "_error" (e.g. a collective that raised)
ABNORMAL_EXITS = ("exception", "terminated", "exited_without_finish")
# exiting without diag.finish and without an error may be a sys.exit or a forgotten finish: a note, not a crash
QUIET_EXIT = "exited_without_finish"
QUIET_VERDICTS = ("no_problem", "slow", "capture_stopped", "incomplete")  # triage's verdicts of no failure
MAX_LISTED = 200
TITLE_ERROR_CHARS = 160


@dataclass
class StepFailure:
    rank: int
    step: int | None  # None: raised outside any step
    kind: str  # step_error, oom, or the event's own *_error kind
    error: str  # the exception as capture recorded it
    time_us: float | None  # on rank 0's clock


@dataclass
class RankExit:
    rank: int
    how: str  # exception, terminated, exited_without_finish, stopped_after_error
    error: str | None
    last_step: int | None  # last step this rank finished


@dataclass
class Blame:
    """``diag triage``'s verdict on the failure: who the others waited for."""

    verdict: str  # missing_ranks, dead_rank, deadlock, desync, collective_hang, step_error, ...
    culprit_ranks: list[int]
    collective: dict | None = None  # {pg, seq, op, sizes, dtype} the verdict is about
    note: str = ""  # why there is no verdict (triage could not judge the trace)
    headline: str = ""  # diag triage's first line
    evidence: list[str] = field(default_factory=list)  # its first lines of evidence


@dataclass
class FailureReport:
    step_errors: list[StepFailure] = field(default_factory=list)  # earliest first
    exits: list[RankExit] = field(default_factory=list)  # ranks that ended abnormally
    failed_steps: list[int] = field(default_factory=list)  # steps in which any rank raised
    blame: Blame | None = None  # triage's culprit, judged when the run failed (judge_failure)
    # a restarted job whose analysed (latest) attempt did not fail: the failure of the attempt before it, as
    # diag triage judges it (earlier_attempt_failure); None when that attempt did not fail either
    earlier: Blame | None = None

    @property
    def first(self) -> StepFailure | None:
        return self.step_errors[0] if self.step_errors else None

    @property
    def crashed(self) -> list[RankExit]:
        return [e for e in self.exits if e.how != QUIET_EXIT or e.error]

    def notes(self) -> list[str]:
        quiet = [e.rank for e in self.exits if e.how == QUIET_EXIT and not e.error]
        if not quiet:
            return []
        return [
            f"{'ranks' if len(quiet) > 1 else 'rank'} {_ranks(quiet)} exited without diag.finish() and without an "
            "error (sys.exit, or diag.finish() not called): their last rows may be missing"
        ]


def find_failures(
    events: pd.DataFrame,
    heartbeats: pd.DataFrame,
    manifests: dict[int, Manifest],
    clock_offsets_us: dict[int, float] | None = None,
) -> FailureReport:
    report = FailureReport(step_errors=_step_errors(events, clock_offsets_us or {}))
    report.failed_steps = sorted({f.step for f in report.step_errors if f.step is not None})
    report.exits = _abnormal_exits(heartbeats, manifests, report.step_errors)
    return report


def judge_failure(trace) -> Blame:
    """``diag triage``'s verdict on a loaded trace (``diag.triage.analysis.triage``, the same function), for a
    run whose ranks raised. Triage is imported here, not at the top: a report of a healthy run never needs it."""
    from diag.triage.analysis import triage
    from diag.triage.sources import input_from_trace, read_diag_trace

    restarted = _restarted_dir(trace)
    try:
        verdict = triage(read_diag_trace(restarted) if restarted else input_from_trace(trace))
    except Exception as exc:  # noqa: BLE001 - a trace triage cannot judge still gets its failure finding
        return Blame("unknown", [], note=f"who the others waited for could not be judged: {exc!r}"[:300])
    return Blame(verdict.verdict, list(verdict.culprit_ranks), verdict.collective)


def earlier_attempt_failure(trace) -> Blame | None:
    """A job restarted into the same directory whose latest attempt (the one analysed) did not fail: the
    earlier attempt's failure as diag triage judges it from every attempt's records, or None when it did not
    fail (or cannot be judged). A clean restart must not hide that the job failed once."""
    from diag.triage.analysis import triage
    from diag.triage.report import headline
    from diag.triage.sources import read_diag_trace

    restarted = _restarted_dir(trace)
    if restarted is None:
        return None
    try:
        verdict = triage(read_diag_trace(restarted))
    except Exception:  # noqa: BLE001 - the report of the latest attempt stands without it
        return None
    if verdict.attempts < 2 or verdict.verdict in QUIET_VERDICTS:
        return None
    return Blame(verdict.verdict, list(verdict.culprit_ranks), verdict.collective, "", headline(verdict),
                 verdict.evidence[:3])  # fmt: skip


def _restarted_dir(trace) -> Path | None:
    """The directory of a job restarted into it, whose loaded trace kept only the latest attempt (the loader cut
    the earlier ones): triage's own read of it keeps every attempt and judges each. None otherwise."""
    if trace.earlier_run_cuts_us and trace.path is not None and Path(trace.path).is_dir():
        return Path(trace.path)
    return None


def _step_errors(events: pd.DataFrame, offsets: dict[int, float]) -> list[StepFailure]:
    if events.empty or "kind" not in events:
        return []
    kind = events["kind"].astype(str)
    errors = events[kind.isin(ERROR_KINDS) | kind.str.endswith("_error")]
    out = []
    for row in errors.to_dict("records"):
        rank = int(row["rank"])
        text = _text(row.get("error")) or _text(row.get("message")) or row["kind"]
        time_us = row.get("time_us")
        time_us = None if _missing(time_us) else float(time_us) - offsets.get(rank, 0.0)
        step = row.get("step")
        out.append(StepFailure(rank, None if _missing(step) else int(step), str(row["kind"]), text, time_us))
    # the earliest failure is usually the cause; the others' errors (a peer's closed connection) follow it
    return sorted(out, key=lambda f: (f.time_us is None, f.time_us or 0.0, f.rank))


def _abnormal_exits(
    heartbeats: pd.DataFrame, manifests: dict[int, Manifest], errors: list[StepFailure]
) -> list[RankExit]:
    exits: dict[int, RankExit] = {}
    if not heartbeats.empty and "exit" in heartbeats:
        for row in heartbeats.to_dict("records"):
            record = row.get("exit")
            if isinstance(record, dict) and record.get("how") in ABNORMAL_EXITS:
                last = row.get("last_step")
                rank = int(row["rank"])
                exits[rank] = RankExit(rank, str(record["how"]), _text(record.get("error")), _int_or_none(last))
    # without the watchdog: a rank whose last recorded step raised and that never reached diag.finish
    finished = _finished_ranks(manifests)
    last_error: dict[int, StepFailure] = {}
    for failure in errors:
        last_error[failure.rank] = failure
    for rank, failure in last_error.items():
        if rank not in exits and rank not in finished and failure.step is not None:
            exits[rank] = RankExit(rank, "stopped_after_error", failure.error, failure.step - 1)
    return [exits[r] for r in sorted(exits)]


def failure_findings(report: FailureReport, ctx: FindingContext | None = None) -> list[Finding]:
    """One finding for the run's failures: the first error named, the ranks that ended, the failed steps."""
    crashed = report.crashed
    if not report.step_errors and not crashed:
        return _earlier_attempt_findings(report.earlier)
    first = report.first
    ended = [e.rank for e in crashed]
    culprits = _culprits(report)
    if culprits and first is not None:
        title = _culprit_title(report.blame, culprits, first, ended)
    elif first is not None:
        where = f"in step {first.step}" if first.step is not None else "outside any step"
        verb = "crashed" if first.rank in ended else "failed"
        title = f"Rank {first.rank} {verb} {where}: {_short(first.error)}"
    else:
        exit_ = crashed[0]
        title = f"Rank {exit_.rank} ended abnormally ({exit_.how}): {_short(exit_.error or '')}".rstrip(": ")
    evidence = _blame_evidence(report.blame, culprits)
    if ended:
        evidence.append(f"ranks that ended without finishing: {_ranks(ended)}")
    for failure in report.step_errors[1:6]:
        where = f"step {failure.step}" if failure.step is not None else "outside any step"
        evidence.append(f"then rank {failure.rank} in {where}: {_short(failure.error)}")
    if len(report.step_errors) > 6:
        evidence.append(f"... {len(report.step_errors) - 6} more errors (see --format json, run.step_errors)")
    for exit_ in crashed:
        if exit_.error and not any(f.rank == exit_.rank for f in report.step_errors):
            evidence.append(f"rank {exit_.rank} ended ({exit_.how}): {_short(exit_.error)}")
    if report.failed_steps:
        evidence.append(
            f"failed steps left out of every other analysis: {_ranks(report.failed_steps)} "
            "(a failed step's time is how long it took to fail)"
        )
    return [
        Finding(
            kind="crash" if ended else "step_error",
            severity="high",
            title=title,
            ranks=sorted({f.rank for f in report.step_errors} | set(ended)),
            time_lost_s=0.0,
            time_lost_per_step_s=0.0,
            evidence=evidence,
            advice=(
                "Start from the culprit: the first errors are the waiting ranks' timeouts and closed connections, "
                "which follow from it. "
                if culprits
                else "Fix the first error: the others usually follow from it (a peer's closed connection or timeout). "
            )
            + "diag triage shows each rank's stacks and pending collectives at the end.",
        )
    ]


def _earlier_attempt_findings(earlier: Blame | None) -> list[Finding]:
    if earlier is None:
        return []
    return [
        Finding(
            kind="earlier_attempt_failed",
            severity="high",
            title=f"An earlier attempt of this job failed, then a restart ran clean: {earlier.headline}",
            ranks=list(earlier.culprit_ranks),
            time_lost_s=0.0,
            time_lost_per_step_s=0.0,
            evidence=earlier.evidence,
            advice="The restart hid it, not fixed it: diag triage on this directory shows that attempt's stacks, "
            "pending collectives and what to do.",
        )
    ]


def _culprits(report: FailureReport) -> list[int]:
    """Triage's culprits, where they are not simply the rank that raised first."""
    blame, first = report.blame, report.first
    if blame is None or not blame.culprit_ranks or first is None:
        return []
    return [] if blame.culprit_ranks == [first.rank] else blame.culprit_ranks


def _culprit_title(blame: Blame, culprits: list[int], first: StepFailure, ended: list[int]) -> str:
    """'Rank 3 held up step 5: the others waited for it in all_reduce (process group 1); rank 0 raised first: ...'."""
    who = f"Rank {culprits[0]}" if len(culprits) == 1 else f"Ranks {_ranks(culprits)}"
    where = f"step {first.step}" if first.step is not None else "the run"
    them = "it" if len(culprits) == 1 else "them"
    collective = blame.collective or {}
    in_op = f" in {collective['op']} (process group {collective['pg']})" if collective.get("op") else ""
    if blame.verdict == "dead_rank":
        why = f"died in {where}; the others waited for {them}{in_op}"
    elif blame.verdict == "deadlock":
        why = f"deadlocked in {where}: they waited for each other across process groups"
    elif blame.verdict == "desync":
        why = f"issued a different collective than the others in {where}{in_op}"
    elif blame.verdict == "step_error":
        why = f"{'crashed' if set(culprits) & set(ended) else 'failed'} in {where}"
    else:
        why = f"held up {where}: the others waited for {them}{in_op}"
    return f"{who} {why}; rank {first.rank} raised first: {_short(first.error)}"


def _blame_evidence(blame: Blame | None, culprits: list[int]) -> list[str]:
    if blame is None:
        return []
    if blame.note:
        return [blame.note]
    if not culprits:
        return []
    return [
        f"culprit as diag triage judges it ({blame.verdict}): {_ranks(culprits)}; the first to raise was waiting "
        "for it and gave up (a timeout, a closed connection)"
        if blame.verdict in ("missing_ranks", "dead_rank")
        else f"culprit as diag triage judges it ({blame.verdict}): {_ranks(culprits)}"
    ]


def _finished_ranks(manifests: dict[int, Manifest]) -> set[int]:
    return {rank for rank, m in manifests.items() if m.finished}


def _text(value) -> str | None:
    return None if _missing(value) else str(value)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _int_or_none(value) -> int | None:
    return None if _missing(value) else int(value)


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= TITLE_ERROR_CHARS else text[: TITLE_ERROR_CHARS - 3] + "..."


def _ranks(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


SECTION = Section("failures", failure_findings, in_json="never", in_report=False)
