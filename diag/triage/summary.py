"""Which ranks ``diag triage`` can judge from their heartbeat alone, and the collectives rows that stand in for
their tables.

A heartbeat written since capture added ``groups`` names, per process group, the last collective the rank
issued and the last one it saw complete; with its pending list that is what the rank's last collectives rows
say about a hang (which collective it waits in, how far each group got, what it issued there). Reading those
rows costs a Parquet footer and row-group decode per rank (most of ``diag triage``'s time at thousands of
ranks); a heartbeat is one small JSON file triage reads anyway. Only where the heartbeat can be trusted to be
the rank's last word is it used; every other rank's tables are read from their ends as before:

* a heartbeat without ``groups`` (written before it existed) or without one at all;
* a rank not in a hang: still running (its rows, flushed every second, may be ahead of a heartbeat written
  every few seconds), finished, or ended without its watchdog ever seeing a stall. Such a job's verdict may
  rest on its whole history (a desync that completed, as an all_reduce of 4x3 against 3x4 does on gloo, is
  found in the rows with Flight Recorder's shapes; the slowest rank on its steps). A stalled rank made no
  progress for the stall threshold, and a rank that ended after a stall wrote its heartbeat last;
* a stale heartbeat with no exit record (the process may have died after its last beat: its rows may be
  newer);
* more collectives pending than the heartbeat lists, or a sequence number unknown (-1);
* a rank in a process group (by its manifest) that no rank's heartbeat reports: a heartbeat follows the
  collectives diag's wrapper issues, and a group only DTensor or C++ code used (a device mesh's
  tensor-parallel group, whose collectives come from Flight Recorder's rows) would be judged as if it had
  none. A group some member's heartbeat reports is one the wrapper sees: a member that reports nothing there
  never issued in it;
* every rank of a process group in which the heartbeats disagree: different last completed collectives, or
  different collectives (op, bytes, dtype, step) at one sequence number. A hung job's groups are frozen, and
  every member saw the same last collective complete; anything else (a desync, a skipped step, a job caught
  mid-flight) is judged from the rows, as before.
"""

from __future__ import annotations

from diag.trace.records import CollectiveMark, Heartbeat

DEAD_MARGIN_INTERVALS = 3  # a heartbeat this many intervals older than the freshest one has stopped
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0


def judged_by_heartbeat(
    heartbeats: dict[int, Heartbeat | None], saw_a_stall: set[int], member_of: dict[int, set[str]] | None = None
) -> set[int]:
    """The ranks whose heartbeat stands in for their collectives rows (see the module's docstring).
    ``saw_a_stall``: the ranks whose watchdog dumped a stall; ``member_of``: by rank, the process groups its
    manifest lists it in."""
    beats = [hb.time_us or 0 for hb in heartbeats.values() if hb is not None]
    freshest_us = max(beats, default=0)
    reported = {_without_incarnation(pg) for hb in heartbeats.values() if hb is not None for pg in _groups_named(hb)}
    member_of = member_of or {}
    candidates = {
        rank: hb
        for rank, hb in heartbeats.items()
        if hb is not None
        and _trusted(hb, freshest_us, rank in saw_a_stall)
        and {_without_incarnation(pg) for pg in member_of.get(rank, set())} <= reported
    }
    disagreeing = _disagreeing_groups(candidates)
    return {rank for rank, hb in candidates.items() if not any(pg in disagreeing for pg in (hb.groups or {}))}


def _groups_named(heartbeat: Heartbeat) -> set[str]:
    """The process groups a heartbeat reports: those of its last collectives, and those of its pending ones."""
    return {str(pg) for pg in heartbeat.groups or {}} | {str(p.pg) for p in heartbeat.pending if p.pg is not None}


def _without_incarnation(pg: str) -> str:
    """A group's name without its incarnation: ``0@1`` is the default group made again after a regroup (the
    manifest keeps both; the heartbeat reports only the living one)."""
    return pg.split("@")[0]


def _trusted(heartbeat: Heartbeat, freshest_us: int, saw_a_stall: bool) -> bool:
    if heartbeat.groups is None:
        return False
    ended = heartbeat.exit is not None and heartbeat.exit.how != "finished"
    if heartbeat.state != "stalled" and not (ended and saw_a_stall):
        return False
    interval_us = float(heartbeat.interval_s or DEFAULT_HEARTBEAT_INTERVAL_S) * 1e6
    stale = freshest_us - (heartbeat.time_us or 0) > DEAD_MARGIN_INTERVALS * interval_us
    if stale and heartbeat.exit is None:  # an exit record's beat is the last by design, however old
        return False
    if (heartbeat.pending_count or 0) > len(heartbeat.pending):
        return False
    marks = [m for g in heartbeat.groups.values() for m in (g.issued, g.completed) if m is not None]
    return all(m.seq is not None and m.seq >= 0 for m in marks) and all(
        p.seq is not None and p.seq >= 0 for p in heartbeat.pending if p.peer is None
    )


def _disagreeing_groups(candidates: dict[int, Heartbeat]) -> set[str]:
    completed: dict[str, set] = {}
    at_seq: dict[tuple[str, int], set] = {}  # (pg, seq) -> the collectives ranks say they issued there
    for heartbeat in candidates.values():
        for pg, progress in (heartbeat.groups or {}).items():
            completed.setdefault(pg, set()).add(progress.completed.seq if progress.completed else None)
            for mark in (progress.issued, progress.completed):
                if mark is not None:
                    at_seq.setdefault((pg, mark.seq), set()).add(_signature(mark))
        for p in heartbeat.pending:
            if p.peer is None:
                at_seq.setdefault((str(p.pg), p.seq), set()).add((p.op, p.bytes, p.dtype, p.step))
    disagreeing = {pg for pg, seqs in completed.items() if len(seqs) > 1}
    return disagreeing | {pg for (pg, _seq), kinds in at_seq.items() if len(kinds) > 1}


def _signature(mark: CollectiveMark) -> tuple:
    return (mark.op, mark.bytes, mark.dtype, mark.step)


def heartbeat_ops(rank: int, heartbeat: Heartbeat) -> list[tuple]:
    """The collectives rows (sources.OPS_COLUMNS) that a rank's heartbeat stands in for: per group its last
    completed collective, and its last issued one where that neither completed nor is pending (it raised
    after being issued: its row has no duration). Pending collectives come from the heartbeat as for every
    rank (sources._add_pending_from_dumps)."""
    pending = {(str(p.pg), p.seq) for p in heartbeat.pending if p.peer is None}
    rows = []
    for pg, progress in (heartbeat.groups or {}).items():
        done, issued = progress.completed, progress.issued
        if done is not None:
            rows.append(_row(rank, pg, done, True))
        newer = issued is not None and (done is None or issued.seq > done.seq)
        if newer and (pg, issued.seq) not in pending:
            rows.append(_row(rank, pg, issued, False))
    return rows


def _row(rank: int, pg: str, mark: CollectiveMark, completed: bool) -> tuple:
    nbytes = mark.bytes or 0
    start_us = float(mark.start_us) if mark.start_us is not None else float("nan")
    step = mark.step if mark.step is not None else -1
    return (
        rank,
        pg,
        mark.seq,
        str(mark.op),
        nbytes,
        mark.dtype or "",
        f"{nbytes} B",
        completed,
        start_us,
        step,
        "",
        "diag",
        "",
    )
