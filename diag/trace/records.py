"""The JSON records the hang watchdog writes beside the tables: ``heartbeat.json`` (rewritten every few
seconds) and ``hang_dump_NNN.json`` (one per stall or signal). The watchdog builds these dataclasses and writes
``to_json()``; triage, ``triage --watch`` and the Prometheus hang metrics read them back with ``from_json``,
which keeps what is usable of a damaged or hand-edited file (a field of the wrong type reads as unknown) and
never raises. Keys are the field names; files written before these classes existed read the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from diag.trace.json_values import finite, int64, text, time_us


@dataclass(frozen=True)
class PendingOp:
    """A collective the rank entered and had not seen complete when the record was written."""

    pg: str | None = None
    seq: int | None = None  # -1 before c10d numbered it
    op: str | None = None
    bytes: int | None = None
    dtype: str | None = None
    peer: int | None = None  # point-to-point only
    start_us: int | None = None  # wall clock it was entered
    step: int | None = None
    source: str | None = None  # py, ddp, ... as in collectives.csv
    seq_inferred: bool = False  # seq read from c10d's counter by the watchdog (a blocking op gets its own late)

    @classmethod
    def from_json(cls, raw) -> PendingOp | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            pg=text(raw.get("pg")),
            seq=int64(raw.get("seq")),
            op=text(raw.get("op")),
            bytes=int64(raw.get("bytes")),
            dtype=text(raw.get("dtype")),
            peer=int64(raw.get("peer")),
            start_us=time_us(raw.get("start_us")),
            step=int64(raw.get("step")),
            source=text(raw.get("source")),
            seq_inferred=raw.get("seq_inferred") is True,
        )


@dataclass(frozen=True)
class CollectiveMark:
    """One collective of a group, as the heartbeat's ``groups`` names the last issued and last completed."""

    seq: int | None = None
    op: str | None = None
    bytes: int | None = None
    dtype: str | None = None
    step: int | None = None
    start_us: int | None = None

    @classmethod
    def from_json(cls, raw) -> CollectiveMark | None:
        if not isinstance(raw, dict) or int64(raw.get("seq")) is None:
            return None
        return cls(
            seq=int64(raw.get("seq")),
            op=text(raw.get("op")),
            bytes=int64(raw.get("bytes")),
            dtype=text(raw.get("dtype")),
            step=int64(raw.get("step")),
            start_us=time_us(raw.get("start_us")),
        )


@dataclass(frozen=True)
class GroupProgress:
    """How far a rank got in one process group: the last collective it issued (handed to the group; a blocking
    call counts once it returned or raised) and the last one it saw complete. With the pending list this is
    what a rank's last collectives rows say, so ``diag triage`` can judge a rank without reading its tables."""

    issued: CollectiveMark | None = None
    completed: CollectiveMark | None = None

    @classmethod
    def from_json(cls, raw) -> GroupProgress | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            issued=CollectiveMark.from_json(raw.get("issued")), completed=CollectiveMark.from_json(raw.get("completed"))
        )


@dataclass(frozen=True)
class Stall:
    """What the heartbeat says of a stall: the collective pending longest, or none when the step itself made
    no progress (the Prometheus hang metrics label their series with it)."""

    pg: str | None = None
    seq: int | None = None
    op: str | None = None
    since_us: int | None = None
    seconds: float | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, raw) -> Stall | None:
        if not isinstance(raw, dict) or finite(raw.get("seconds")) is None:
            return None
        return cls(
            pg=text(raw.get("pg")),
            seq=int64(raw.get("seq")),
            op=text(raw.get("op")),
            since_us=time_us(raw.get("since_us")),
            seconds=finite(raw.get("seconds")),
            reason=text(raw.get("reason")),
        )


@dataclass(frozen=True)
class ExitRecord:
    """How the process ended, once the watchdog knew: finished, terminated (a signal), exception."""

    how: str | None = None
    signal: str | None = None
    error: str | None = None
    traceback: str | None = None
    time_us: int | None = None

    @classmethod
    def from_json(cls, raw) -> ExitRecord | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            how=text(raw.get("how")),
            signal=text(raw.get("signal")),
            error=text(raw.get("error")),
            traceback=text(raw.get("traceback")),
            time_us=time_us(raw.get("time_us")),
        )


@dataclass(frozen=True)
class RankState:
    """Where the rank was when a record was written (both records start with these)."""

    rank: int | None = None
    pid: int | None = None
    time_us: int | None = None  # wall clock of the record
    step: int | None = None  # the step in progress, None between steps
    last_step: int | None = None  # the last step completed
    phase: str | None = None
    step_started_us: int | None = None

    @staticmethod
    def fields_from_json(raw: dict) -> dict:
        return {
            "rank": int64(raw.get("rank")),
            "pid": int64(raw.get("pid")),
            "time_us": time_us(raw.get("time_us")),
            "step": int64(raw.get("step")),
            "last_step": int64(raw.get("last_step")),
            "phase": text(raw.get("phase")),
            "step_started_us": time_us(raw.get("step_started_us")),
        }


@dataclass(frozen=True)
class Heartbeat(RankState):
    """``heartbeat.json``: a rank alive (its time_us keeps moving), stuck (``stall``) or ended (``exit``)."""

    state: str | None = None  # running, stalled, finished, or how it ended
    interval_s: float | None = None  # how often it is rewritten
    threshold_s: float | None = None  # a collective pending this long is a stall
    pending: tuple[PendingOp, ...] = ()  # the first MAX_PENDING_IN_HEARTBEAT of them
    pending_count: int | None = None
    stall: Stall | None = None
    last_seq: dict[str, int] = field(default_factory=dict)  # highest seq completed per process group
    dumps_written: int | None = None
    exit: ExitRecord | None = None
    # per process group, the last collective issued and completed; None in heartbeats written before it existed
    # (an empty dict: the rank issued no collective yet)
    groups: dict[str, GroupProgress] | None = None

    @classmethod
    def from_json(cls, raw) -> Heartbeat | None:
        if not isinstance(raw, dict):
            return None
        last_seq = raw.get("last_seq") if isinstance(raw.get("last_seq"), dict) else {}
        groups = raw.get("groups")
        return cls(
            **RankState.fields_from_json(raw),
            state=text(raw.get("state")),
            interval_s=finite(raw.get("interval_s")),
            threshold_s=finite(raw.get("threshold_s")),
            pending=_pending(raw.get("pending")),
            pending_count=int64(raw.get("pending_count")),
            stall=Stall.from_json(raw.get("stall")),
            last_seq={str(pg): int64(seq) for pg, seq in last_seq.items() if int64(seq) is not None},
            dumps_written=int64(raw.get("dumps_written")),
            exit=ExitRecord.from_json(raw.get("exit")),
            groups=_groups(groups) if isinstance(groups, dict) else None,
        )

    def to_json(self) -> dict:
        return to_json(self)


@dataclass(frozen=True)
class HangDump(RankState):
    """``hang_dump_NNN.json``: every thread's stack and the pending collectives when a stall or signal came."""

    reason: str | None = None  # "stall: ...", "signal SIGTERM", "uncaught ValueError"
    pending: tuple[PendingOp, ...] = ()
    threads: tuple[dict, ...] = ()  # {name, ident, main, frames: [{file, line, function}]}
    fr_dump: str | None = None  # the Flight Recorder dump written with it, if any
    fr_error: str | None = None  # why none could be written
    exit: ExitRecord | None = None

    @classmethod
    def from_json(cls, raw) -> HangDump | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            **RankState.fields_from_json(raw),
            reason=text(raw.get("reason")),
            pending=_pending(raw.get("pending")),
            threads=_threads(raw.get("threads")),
            fr_dump=text(raw.get("fr_dump")),
            fr_error=text(raw.get("fr_error")),
            exit=ExitRecord.from_json(raw.get("exit")),
        )

    def to_json(self) -> dict:
        return to_json(self)

    def main_frames(self) -> list[dict]:
        """The main thread's frames, innermost last; [] when the dump has none."""
        for thread in self.threads:
            if thread.get("main"):
                frames = thread.get("frames")
                return frames if isinstance(frames, list) else []
        return []


def _threads(raw) -> tuple[dict, ...]:
    """A dump's threads, each a dict whose frames are a list of dicts: a thread or frame of another type (a
    damaged or crafted dump) is left out here, once, so that no reader of the stacks meets one."""
    if not isinstance(raw, list):
        return ()
    threads = []
    for thread in raw:
        if isinstance(thread, dict):
            frames = thread.get("frames")
            frames = [frame for frame in frames if isinstance(frame, dict)] if isinstance(frames, list) else []
            threads.append({**thread, "frames": frames})
    return tuple(threads)


def to_json(record) -> dict:
    """A record as the JSON object the watchdog writes (tuples as lists)."""
    return dataclasses.asdict(
        record, dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v for k, v in items}
    )


def _groups(raw: dict) -> dict[str, GroupProgress]:
    entries = ((str(pg), GroupProgress.from_json(progress)) for pg, progress in raw.items())
    return {pg: progress for pg, progress in entries if progress is not None}


def _pending(raw) -> tuple[PendingOp, ...]:
    entries = (PendingOp.from_json(p) for p in raw) if isinstance(raw, list) else ()
    return tuple(p for p in entries if p is not None)
