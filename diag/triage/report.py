"""Text rendering of a triage verdict (computing stays in analysis.py)."""

from __future__ import annotations

from diag.triage.action import NONE, Action
from diag.triage.analysis import NOTHING_TO_JUDGE, RankReport, Verdict, _payload
from diag.views.format import printable

HEADLINES = {
    "missing_ranks": "HANG: {ranks} never reached a collective the others are waiting in",
    "deadlock": "DEADLOCK: {ranks} wait for each other in collectives of different process groups",
    "collective_hang": "HANG INSIDE A COLLECTIVE: every member entered it and none completed it (network or NCCL level)",
    "desync": "DESYNC: {ranks} issued a different collective than the others at the same sequence number",
    "dead_rank": "DEAD RANK: the process of {ranks} is gone",
    "step_error": "FAILED: {ranks} raised an error, and no collective was left pending",
    "slow": "SLOW, NOT HUNG: every rank is progressing; slowest: {ranks}",
    "capture_stopped": "CAPTURE STOPPED on {ranks}: no problem found in what was recorded, but nothing after it was",
    "incomplete": "INCOMPLETE: nothing of {ranks} could be read; the other ranks show no problem",
    "no_problem": "NO PROBLEM FOUND: no pending, mismatched or abandoned collective, no dead rank",
}
ACTION_WORDS = {"fix_code": "FIX THE CODE", "restart": "RESTART", "evict": "EVICT"}
MAX_RANKS_LISTED = 32
STACK_FRAMES_SHOWN = 8


def headline(verdict: Verdict) -> str:
    """The verdict's first line: what is wrong, and with which ranks."""
    culprits = verdict.culprit_ranks
    ranks_text = f"{'rank' if len(culprits) == 1 else 'ranks'} {', '.join(map(str, culprits))}" if culprits else "-"
    if verdict.verdict == "desync" and not culprits:  # e.g. all_to_all totals without split sizes
        return "DESYNC: the members of one collective disagree on what it moves; which rank is wrong is unknown"
    if verdict.evidence[:1] == [NOTHING_TO_JUDGE]:
        return "NOTHING TO JUDGE: the directory holds no collectives, heartbeats or dumps"
    return HEADLINES[verdict.verdict].format(ranks=ranks_text)


def format_text(verdict: Verdict, all_ranks: bool = False) -> str:
    lines = [headline(verdict)]
    if verdict.errors_caught:
        lines.append("the job caught the error and finished: this is where it failed, from the errors it recorded")
    if verdict.attempts > 1:
        lines.append(
            f"{verdict.attempts} attempts wrote into this directory (a restarted job): this is the first's failure"
        )
    if verdict.collective:
        c = verdict.collective
        lines.append(f"collective: {c['op']} seq {c['seq']} in process group {c['pg']} ({_payload(c)})")
    if verdict.action is not None and verdict.action.kind != NONE:
        lines.append(_action_line(verdict.action))
    lines.append("")
    lines.append("evidence:")
    lines += [f"  {line}" for line in verdict.evidence]
    shown = _ranks_to_show(verdict, all_ranks)
    if shown:
        lines.append("")
        lines.append("ranks:")
        for rank in shown:
            lines += _rank_lines(rank, verdict.ranks[rank], rank in verdict.culprit_ranks)
        hidden = len(verdict.ranks) - len(shown)
        if hidden > 0:
            lines.append(f"  ... {hidden} more ranks (--all-ranks to list them, --format json for everything)")
    if verdict.skipped:
        lines.append("")
        lines.append("skipped (not analysed):")
        lines += [f"  {s}" for s in verdict.skipped]
    return "\n".join(printable(line) for line in lines)  # names and messages from the files: no escapes


def _action_line(action: Action) -> str:
    where = [f"host {', '.join(action.hosts)}"] if action.hosts else []
    where += [f"GPU {', '.join(action.gpus)}"] if action.gpus else []
    on = f" ({'; '.join(where)})" if where else ""
    return f"next: {ACTION_WORDS[action.kind]}{on}: {action.why}"


def _ranks_to_show(verdict: Verdict, all_ranks: bool) -> list[int]:
    if all_ranks:
        return sorted(verdict.ranks)
    culprits = sorted(verdict.culprit_ranks)
    others = sorted(r for r in verdict.ranks if r not in set(culprits))
    by_state: dict[str, int] = {}
    for rank in others:  # one example of every other state
        by_state.setdefault(verdict.ranks[rank].state, rank)
    return (culprits + sorted(by_state.values()))[:MAX_RANKS_LISTED]


def _rank_lines(rank: int, report: RankReport, culprit: bool) -> list[str]:
    mark = "*" if culprit else " "
    head = f" {mark}rank {rank}: {report.state}"
    if report.last_step is not None:
        head += f", last completed step {report.last_step}"
    if report.last_phase:
        head += f", phase {report.last_phase}"
    lines = [head]
    if report.detail:
        lines.append(f"      {report.detail}")
    if culprit and report.stack:
        lines.append("      stack (innermost last):")
        lines += [f"        {frame}" for frame in report.stack[-STACK_FRAMES_SHOWN:]]
    return lines
