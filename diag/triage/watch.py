"""``diag triage --watch``: judge a running job as its heartbeats and dumps arrive, and say so as soon as a verdict
is possible, well before the collective timeout kills the job.

The watchdog on each rank rewrites ``heartbeat.json`` every ``heartbeat_interval_s`` (5 s by default) with the
collectives it has pending and when each was entered; it writes a hang dump only after ``hang_threshold_s``
(120 s). Watching does not wait for that dump: a collective pending longer than ``stall_s`` in a heartbeat, a
rank whose heartbeats stopped for that long while it had not finished, or a rank that raised or died is a
stall, and the job is judged then (the same ``triage`` as ``diag triage``). A stall the judgement cannot
explain yet (every rank progressing) is reported once as a status line and watching goes on.

No torch import: the watch runs beside the job, anywhere the trace directory is readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from diag.trace.loader import TraceError
from diag.trace.records import Heartbeat
from diag.trace.schema import CAPTURE_STOPPED
from diag.triage.analysis import Verdict, triage
from diag.triage.sources import TriageInput, read_input

DEFAULT_STALL_S = 20.0  # a collective pending this long in a healthy job is already very unusual
DEFAULT_INTERVAL_S = 2.0
HANG_VERDICTS = ("missing_ranks", "deadlock", "desync", "dead_rank", "collective_hang")
# a problem found, for the exit status: a hang, an error the job recorded (caught or not), or a capture that
# stopped so that what followed is unknown
PROBLEM_VERDICTS = (*HANG_VERDICTS, "step_error", "capture_stopped")
BAD_EXITS = ("exception", "exited_without_finish")  # the watchdog's exit records that end a rank early


@dataclass
class Progress:
    """What the watch saw at one poll."""

    state: str  # "waiting" (no trace yet), "running", "stalled", "finished" (every rank ended, however)
    detail: str


def stall_of(data: TriageInput, now_us: float, stall_s: float) -> Progress:
    """Whether the job stalled (or ended), from the ranks' last heartbeats, as of ``now_us``."""
    ranks = data.ranks
    if not ranks:
        return Progress("waiting", "no rank has written its trace yet")
    exits = {rank: _exit_how(info) for rank, info in ranks.items()}
    if all(how is not None for how in exits.values()):
        hows = sorted(set(exits.values()))
        return Progress("finished", f"every rank ended ({', '.join(hows)})")
    for rank, how in sorted(exits.items()):
        if how in BAD_EXITS:
            return Progress("stalled", f"rank {rank} ended ({how})")
    for rank, info in sorted(ranks.items()):
        heartbeat = info.heartbeat or Heartbeat()
        beat_us = _number(heartbeat.time_us)
        if exits[rank] is not None or beat_us is None:
            continue
        if heartbeat.state == CAPTURE_STOPPED:  # it writes nothing more: watching it cannot tell more
            return Progress("stalled", f"rank {rank}'s capture stopped (its manifest says why)")
        if now_us - beat_us > stall_s * 1e6 + _number(heartbeat.interval_s, 0.0) * 1e6:
            return Progress("stalled", f"rank {rank} wrote no heartbeat for {(now_us - beat_us) / 1e6:.0f} s")
        oldest = _oldest_pending(heartbeat)
        if oldest is not None and beat_us - oldest[0] > stall_s * 1e6:
            start_us, what = oldest
            return Progress("stalled", f"rank {rank} has waited {(beat_us - start_us) / 1e6:.0f} s in {what}")
        if heartbeat.state == "stalled":
            return Progress("stalled", f"rank {rank}'s watchdog reports a stall")
    ras = data.nccl_ras
    if ras is not None and (ras.frozen or ras.dead):  # saved RAS polls: counts stuck, or a process gone
        why = "operation counts unchanged across polls" if ras.frozen else "a process considered dead"
        return Progress("stalled", f"NCCL RAS: {why}")
    return Progress("running", f"{len(ranks)} ranks running")


def watch(
    path,
    stall_s: float = DEFAULT_STALL_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    say: Callable[[str], None] = print,
    on_verdict: Callable[[Verdict], None] | None = None,
    now_s: Callable[[], float] = time.time,
    workers: int | None = None,
) -> int:
    """Poll ``path`` until a hang verdict can be given (returns 1) or every rank finished (returns 1 if the
    verdict is a hang, else 0). ``workers``: processes reading a large trace's ranks (see read_input)."""
    last_status = None
    while True:
        try:
            data = read_input(path, workers=workers)
        except TraceError as exc:
            data, progress = None, Progress("waiting", str(exc))
        else:
            progress = stall_of(data, now_s() * 1e6, stall_s)
        if data is not None and progress.state in ("stalled", "finished"):
            verdict = triage(data)
            if progress.state == "finished" or verdict.verdict in HANG_VERDICTS:
                say(f"[{_clock(now_s())}] {progress.detail}: judged")
                if on_verdict is not None:
                    on_verdict(verdict)
                return 1 if verdict.verdict in PROBLEM_VERDICTS else 0  # as diag triage: exit status 1 for a problem
        status = f"{progress.state}: {progress.detail}"
        if status != last_status:  # a line when something changes, not one per poll
            say(f"[{_clock(now_s())}] {status}")
            last_status = status
        time.sleep(interval_s)


def _oldest_pending(heartbeat: Heartbeat) -> tuple[float, str] | None:
    found = [
        (float(p.start_us), f"{p.op} seq {p.seq} of process group {p.pg}")
        for p in heartbeat.pending
        if p.start_us is not None
    ]
    return min(found) if found else None


def _exit_how(info) -> str | None:
    return info.heartbeat.exit.how if info.heartbeat and info.heartbeat.exit else None


def _number(value, default=None):
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return default
    return float(value)


def _clock(time_s: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(time_s))
