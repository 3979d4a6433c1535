"""The verdict of ``diag triage``: pure functions from a ``TriageInput`` to a ``Verdict``. No torch.

Collectives line up across ranks by (process group, sequence number): c10d numbers every collective of a
group in issue order on every rank. Then, in order of precedence:
Before judging, what is known to have returned is marked so: a rank that reached ``diag.finish`` returned from
every collective it issued, and a collective issued before one the same rank completed in the same group
returned too (a group runs its collectives in order), even where nothing timed it (gloo's DDP buckets read
from Flight Recorder carry no completion); so did a gloo bucket issued before the rank's current step began,
when the step before completed without an error.
* desync: at one (pg, seq) ranks issued different collectives (op, bytes, dtype, and the tensors' shapes
  where every rank's record has them: an all_reduce of 4x3 against 3x4 moves equal bytes). The culprits are the
  minority; on a tie, the side whose collective the group issued least often before; on a tie again,
  the side without the lowest rank. Never the order files were read in.
* Flight Recorder input only (``fr_checks``): a send/recv pair or an all_to_all whose sizes disagree (desync),
  then a send or recv still pending whose peer never issued its counterpart (missing_ranks, the peer).
* dead_rank / missing_ranks: the oldest collective still pending that some members never reached (from gloo
  dumps, the first seq some members never issued; from NCCL's, also members whose copy is only scheduled
  while others started it). If every missing rank's process is gone (heartbeat stopped with no exit record,
  or it ended before the others started waiting), the verdict is dead_rank; otherwise missing_ranks, with
  where each missing rank was.
* dead_rank without a pending collective: a rank vanished while others went on.
* deadlock: the missing ranks wait for each other in collectives of other groups (a cycle, e.g. two ranks
  entering two groups' collectives in opposite orders); every rank on the cycle is a culprit.
* missing_ranks also when every member entered the pending collective but some entered only after another
  member had already given up on it (its collective timed out): when the timeout fired they were absent.
* collective_hang: every member entered the pending collective in time and none completed it (a network or
  NCCL-level hang): no rank is missing; each rank's entry time and the group's backend are given.
* errors the ranks recorded (``collective_error``, ``step_error`` events) count whether or not the job caught
  them: a collective that raised never returned, and a rank gave up when it raised, so a job that catches the
  error and finishes gets the verdict it gets when the error ends it; recorded errors with nothing pending are
  step_error, never no_problem. Records from before a rank's latest diag.init are an earlier attempt's (a
  restarted job), judged when the latest attempt reads healthy.
* no_problem when every rank was ended by a signal with no stall seen before (a preempted healthy job), even
  if some were inside a collective the first-stopped ranks never reached.
* slow: nothing hung, but a watchdog stall was seen, or all members are inside one collective; the
  slowest rank named.
* capture_stopped: nothing else found, but capture stopped mid-run on some ranks (a full disk, a directory made
  read-only): what they did after it is unknown, so this is no clean bill of health; the ranks are named.
* no_problem.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.nccl import group_evidence
from diag.trace.records import ExitRecord, Heartbeat
from diag.trace.schema import CAPTURE_STOPPED
from diag.triage.action import NONE, Action
from diag.triage.action import decide as decide_action
from diag.triage.errors import COMMUNICATION_FAILURE_PATTERN, TIMEOUT_PATTERN, is_own_error
from diag.triage.flight_recorder import is_library_file
from diag.triage.sources import ERROR_COLUMNS, P2P_OPS, RankInfo, TriageInput, is_p2p, main_frames
from diag.triage.summary import DEAD_MARGIN_INTERVALS, DEFAULT_HEARTBEAT_INTERVAL_S

NOTHING_TO_JUDGE = (
    "nothing to judge: no collectives, heartbeats, hang dumps or Flight Recorder entries were found "
    "(was diag.init run with watchdog=True?); this is no evidence that the job was healthy"
)
MAX_OTHER_HANGS = 5  # other groups' pending collectives listed as evidence
DATA_LOADER_FUNCTIONS = ("__next__", "_next_data", "_get_data", "_try_get_data", "wrap_loader")
BARRIER_FUNCTIONS = ("barrier", "monitored_barrier", "_store_based_barrier")


@dataclass
class RankReport:
    state: str  # see docs/triage.md "Rank states"
    last_step: int | None = None
    last_phase: str | None = None
    stack: list[str] = field(default_factory=list)  # main thread, outermost first: "file:line in function"
    detail: str = ""


@dataclass
class Verdict:
    verdict: str  # missing_ranks, deadlock, desync, dead_rank, collective_hang, step_error, slow, capture_stopped, no_problem
    culprit_ranks: list[int]
    collective: dict | None  # {pg, seq, op, sizes}
    ranks: dict[int, RankReport]
    evidence: list[str]
    skipped: list[str] = field(default_factory=list)
    errors_caught: bool = False  # ranks recorded the error and still finished: the job caught it
    attempts: int = 1  # diag.init runs into this directory seen (a restarted job's attempts)
    action: Action | None = None  # what to do next (action.py), set once the verdict is final

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "culprit_ranks": self.culprit_ranks,
            "collective": self.collective,
            "ranks": {str(r): asdict(v) for r, v in sorted(self.ranks.items())},
            "evidence": self.evidence,
            "skipped": self.skipped,
            "errors_caught": self.errors_caught,
            "attempts": self.attempts,
            **(self.action or Action(NONE, "not decided")).to_json(),
        }


NO_EXIT = ExitRecord()  # a rank with no exit record: every field unknown
UNCAUGHT = "uncaught_exception"  # the error row of an exception that ended a rank outside any step


def triage(data: TriageInput) -> Verdict:
    verdict, judged = _judge_attempts(data)
    verdict.action = decide_action(verdict, judged)  # on the records of the attempt the verdict is about
    return verdict


def _judge_attempts(data: TriageInput) -> tuple[Verdict, TriageInput]:
    """The verdict, and the input of the attempt it judged."""
    earlier, latest = _split_attempts(_with_uncaught_exceptions(data))
    verdict = _judge(latest)
    if earlier is None:
        return verdict, latest
    if verdict.verdict in ("no_problem", "slow"):  # a restart that ran clean must not hide the failed attempt
        earlier = _with_uncaught_exceptions(earlier)
        first = _judge(earlier)
        if not _kept_earlier_heartbeats(data):
            for rank, report in first.ranks.items():  # no heartbeat kept: its exit record is the later attempt's
                errors = earlier.errors[earlier.errors["rank"] == rank]
                if len(errors):
                    report.detail = f"first attempt: {_error_text(errors.iloc[0])}; later attempt: {report.detail}"
        first.evidence.append(_later_attempt_text(latest, verdict))
        first.attempts = 2
        return first, earlier
    failure = _errors_text(earlier.errors) if len(earlier.errors) else "it did not end by diag.finish"
    verdict.evidence.append(f"an earlier attempt wrote into this directory too: {failure}")
    verdict.attempts = 2
    return verdict, latest


def _judge(data: TriageInput) -> Verdict:
    liveness = _liveness(data)
    # known returned first: a collective that returned on one member returned on all, so the others' pending
    # copies of it are stale too
    ops = _with_failed(_with_signature(data.ops), data.errors)
    ops = _returned_before_this_step(ops, data)
    ops = _drop_stale_pending(_mark_known_returned(ops, liveness, _gloo_steps_begun(data)))
    members = _members(data)
    desync = _first_desync(_collectives_only(_issued_before_first_error(ops, data)))
    if desync is not None:
        return _desync_verdict(data, ops, desync, liveness)
    if data.fr_problems:
        return _fr_problem_verdict(data, ops, liveness)
    hangs = _hangs(_collectives_only(ops), members, data)
    if hangs and _stopped_from_outside(data):
        return _stopped_verdict(data, ops, hangs, members, liveness)
    if hangs:
        return _hang_verdict(data, ops, hangs, liveness)
    vanished = sorted(r for r, state in liveness.items() if state == "vanished")
    if vanished:
        return _dead_without_hang(data, ops, vanished, liveness)
    stalled = _stalled_apart(data) if len(data.errors) else None
    if stalled is not None:
        return _stalled_apart_verdict(data, ops, liveness, *stalled)
    if len(data.errors):
        return _error_verdict(data, ops, liveness)
    verdict = _slow_or_fine(data, ops, members, liveness)
    if verdict.verdict in ("no_problem", "slow") and data.nccl_ras is not None and data.nccl_ras.frozen:
        return _ras_stuck_verdict(data, ops, liveness)
    return verdict


def _ras_stuck_verdict(data: TriageInput, ops: pd.DataFrame, liveness: dict) -> Verdict:
    """Nothing else pending, but NCCL RAS shows ranks of a communicator at different operation counts that did
    not move across successive polls: the ranks behind never launched the operation the others wait in."""
    behind = data.nccl_ras.behind
    ranks = _rank_reports(data, ops, liveness, focus=None)
    evidence = [
        "NCCL RAS: a communicator's operation counts disagree and did not move across successive polls: "
        + (f"{_ranks_text(behind)} never launched the operation the others wait in" if behind else "stuck")
    ]
    evidence += [f"rank {r}: {_describe(ranks[r])}" for r in behind if r in ranks]
    return _verdict("missing_ranks" if behind else "collective_hang", behind, None, ranks, evidence, data)


# -- cross-rank matching ---------------------------------------------------------------------------------------


def _with_signature(ops: pd.DataFrame) -> pd.DataFrame:
    """What must match across ranks at one (pg, seq): op, bytes and dtype, plus the shapes where every rank's
    record of that collective has them (Flight Recorder's input and output sizes); a rank whose record lacks
    shapes never makes a desync by that alone."""
    ops = ops.copy()
    ops["rank"] = ops["rank"].astype("int64")
    ops["seq"] = ops["seq"].astype("int64")
    ops["completed"] = ops["completed"].astype(bool)
    base = ops["op"].astype(str) + "|" + ops["bytes"].astype(str) + "|" + ops["dtype"].astype(str)
    shape = ops["shape"].fillna("").astype(str) if "shape" in ops else pd.Series("", index=ops.index)
    every_rank_has_shape = shape.ne("").groupby([ops["pg"], ops["seq"]]).transform("all")
    ops["signature"] = base.where(~every_rank_has_shape, base + "|" + shape)
    return ops


def _mark_known_returned(ops: pd.DataFrame, liveness: dict[int, str], steps_begun: dict[int, int]) -> pd.DataFrame:
    """Rows nothing timed but that certainly returned: the rank finished (diag.finish runs after every
    collective it issued returned), or, for a row diag wrote untimed (DDP's gradient buckets), the rank issued
    a collective of the group in a later step or began a later step (``steps_begun``): the step ended, and DDP
    waits for every bucket before its backward returns; then every collective a rank issued before one of the
    same group that returned (a group runs its collectives in order: DDP's constructor's, untimed and before
    any step, returned when the first step's buckets did)."""
    if ops.empty or ops["completed"].all():
        return ops
    finished = [r for r, state in liveness.items() if state == "finished"]
    p2p = is_p2p(ops)  # a later send says nothing of an earlier all_reduce
    raised = ops["failed"] if "failed" in ops else pd.Series(False, index=ops.index)
    begun = ops["rank"].map(steps_begun).astype("float64")
    last_step = np.fmax(ops.groupby(["rank", "pg"])["step"].transform("max").astype("float64"), begun)
    untimed = ~ops["completed"] & ops["source"].eq("diag")
    step_ended = untimed & (ops["step"] >= 0) & (ops["step"] < last_step)
    # it returned by raising: the rank finished because the job caught the error
    completed = (ops["completed"] | ops["rank"].isin(finished) | step_ended) & ~raised
    done_seq = ops["seq"].where(completed & ~p2p).groupby([ops["rank"], ops["pg"]]).transform("max")
    later_done = ~p2p & (ops["seq"] < done_seq.fillna(-1))
    ops = ops.copy()
    ops.loc[(completed | (later_done & ~raised)).to_numpy(), "completed"] = True
    return ops


def _gloo_steps_begun(data: TriageInput) -> dict[int, int]:
    """Per gloo rank, the latest step it is known to have begun, or to be past: its heartbeat's current step,
    the step after the last it completed (a rank that raised between two steps, or exited, is in none: its
    last step's buckets returned before that step ended), or the step of an error it recorded (a data loader
    that raised before the step's first collective). Not for NCCL: a step ends with its collectives still
    running on the GPU."""
    begun: dict[int, int] = {}
    errors = data.errors[data.errors["step"].notna()] if len(data.errors) else data.errors
    error_steps = errors.groupby("rank")["step"].max() if len(errors) else pd.Series(dtype="float64")
    for rank, info in data.ranks.items():
        if info.backend != "gloo":
            continue
        beat = info.heartbeat
        beat_step = beat.step if beat is not None else None
        after_completed = beat.last_step + 1 if beat is not None and beat.last_step is not None else None
        candidates = (beat_step, after_completed, error_steps.get(rank))
        steps = [int(s) for s in candidates if s is not None and s == s]
        if steps:
            begun[rank] = max(steps)
    return begun


def _returned_before_this_step(ops: pd.DataFrame, data: TriageInput) -> pd.DataFrame:
    """gloo Flight Recorder entries (no step, no completion: DDP's gradient buckets a dump holds past diag's last
    row) that the rank issued before its current step began, when the step before it completed and the rank
    recorded no error since: DDP waits for every bucket before its backward returns, and gloo's wait is the
    CPU's, so they returned. Without this a bucket of the last finished step reads as the collective a rank
    hangs in, hiding where it really waits (another group's barrier, a cross-group deadlock). Not for NCCL: a
    step ends with its collectives still running on the GPU."""
    candidates = ~ops["completed"] & ops["source"].astype(str).str.startswith("flight_recorder") & (ops["step"] < 0)
    if not candidates.any():
        return ops
    began_us = {}
    for rank, info in data.ranks.items():
        beat = info.heartbeat
        if info.backend != "gloo" or beat is None or beat.step is None or beat.step_started_us is None:
            continue
        if beat.last_step is None or beat.last_step != beat.step - 1:
            continue  # the step before did not complete: its buckets may never have returned
        errors = data.errors[(data.errors["rank"] == rank) & data.errors["time_us"].notna()]
        first_error_us = float(errors["time_us"].min()) if len(errors) else float("inf")
        began_us[rank] = min(float(beat.step_started_us), first_error_us)
    if not began_us:
        return ops
    before = ops["start_us"].astype("float64") < ops["rank"].map(began_us).astype("float64")
    returned = (candidates & before.fillna(False)).to_numpy()
    if not returned.any():
        return ops
    ops = ops.copy()
    ops.loc[returned, "completed"] = True
    return ops


def _with_failed(ops: pd.DataFrame, errors: pd.DataFrame) -> pd.DataFrame:
    """Mark the collectives that raised on a rank (its ``collective_error`` events) as ``failed``, adding those
    no row was read for, and the untimed rows of a step that raised on it. A failed collective never
    completed, whether the job then died or caught the error."""
    failed = errors[(errors["kind"] == "collective_error") & errors["seq"].notna() & (errors["seq"] >= 0)]
    ops["failed"] = _in_failed_step(ops, errors)  # ops is _with_signature's own copy: no second copy at scale
    if failed.empty:
        return ops
    failed = failed.drop_duplicates(["rank", "pg", "seq"]).astype({"seq": "int64"})
    # sends and receives are numbered apart from the group's collectives: match each with its own kind
    failed = failed.assign(p2p=is_p2p(failed))
    keys = pd.MultiIndex.from_frame(failed[["rank", "pg", "seq", "p2p"]])
    known = pd.MultiIndex.from_frame(ops[["rank", "pg", "seq"]].astype({"pg": str}).assign(p2p=is_p2p(ops)))
    ops.loc[known.isin(keys), ["failed", "completed"]] = [True, False]
    absent = failed[~keys.isin(known)]
    if absent.empty:
        return ops
    # what the other members issued at that seq (a failed op's event names the op, not its payload)
    peers = _collectives_only(ops).drop_duplicates(["pg", "seq"]).set_index(["pg", "seq"])
    at = pd.MultiIndex.from_frame(absent[["pg", "seq"]])
    op = absent["op"].astype(str)
    signature = peers["signature"].reindex(at).to_numpy(dtype=object)
    unknown = pd.isna(signature)
    signature[unknown] = (op + "|0|").to_numpy(dtype=object)[unknown]
    rows = pd.DataFrame(
        {
            "rank": absent["rank"].to_numpy(),
            "pg": absent["pg"].to_numpy(),
            "seq": absent["seq"].to_numpy(),
            "op": op.to_numpy(),
            "bytes": peers["bytes"].reindex(at).fillna(0).astype("int64").to_numpy(),
            "dtype": peers["dtype"].reindex(at).fillna("").to_numpy(),
            "sizes": peers["sizes"].reindex(at).fillna("0 B").to_numpy(),
            "completed": False,
            "start_us": absent["start_us"].to_numpy(),
            "step": absent["step"].fillna(-1).astype("int64").to_numpy(),
            "call_site": "",
            "source": "diag-error",
            "shape": "",
            "signature": signature,
            "failed": True,
            "state": "",  # Flight Recorder's own state: a raised collective's row comes from diag's events
        }
    )
    return pd.concat([ops, rows[ops.columns]], ignore_index=True)


def _in_failed_step(ops: pd.DataFrame, errors: pd.DataFrame) -> pd.Series:
    """Untimed rows (DDP's buckets read from Flight Recorder carry no completion) of a step that raised on that
    rank: nothing says they returned, as nothing would had the exception ended the process."""
    raised = errors[~errors["kind"].eq("collective_error") & errors["step"].notna()]
    if raised.empty or ops.empty:
        return pd.Series(False, index=ops.index)
    keys = pd.MultiIndex.from_arrays([raised["rank"].astype("int64"), raised["step"].astype("int64")])
    rows = pd.MultiIndex.from_arrays([ops["rank"].astype("int64"), ops["step"].astype("int64")])
    return pd.Series(rows.isin(keys) & ~ops["completed"].to_numpy(), index=ops.index)


def _drop_stale_pending(ops: pd.DataFrame) -> pd.DataFrame:
    """A collective diag saw complete (or knew returned) on one member completed on all: a rank that shows it
    pending is showing an old snapshot (a heartbeat written before it returned, rows lost to a SIGKILL, a gloo
    Flight Recorder entry that never reads completed)."""
    p2p = is_p2p(ops).to_numpy()  # a completed send at seq 3 is not the group's op at seq 3
    done = ops[ops["completed"] & (ops["source"] == "diag") & ~p2p][["pg", "seq"]].drop_duplicates()
    if done.empty or ops["completed"].all():
        return ops
    marked = ops.merge(done.assign(_done=True), on=["pg", "seq"], how="left")
    stale = ~marked["completed"] & marked["_done"].fillna(False).astype(bool) & ~p2p
    return ops[~stale.to_numpy()].reset_index(drop=True)


def _collectives_only(ops: pd.DataFrame) -> pd.DataFrame:
    """The rows that every member of their group issues under one sequence number. Point-to-point ops are
    numbered per rank by their own counter (as Flight Recorder numbers them), so the k-th recv of one rank and
    of another are not one op: matching them by (group, seq) would read a pipeline's sends and recvs as a
    desync."""
    return ops[~is_p2p(ops)]


def _issued_before_first_error(ops: pd.DataFrame, data: TriageInput) -> pd.DataFrame:
    """The rows issued before the first error the job recorded: after it, ranks run their handlers (a
    framework's SIGTERM handler broadcasts, a teardown barriers) while the others have given up, and what they
    issue then is no desync of the job's. A real desync issues its mismatched collectives before the error
    they cause."""
    times = data.errors["time_us"].dropna() if len(data.errors) else None
    if times is None or times.empty:
        return ops
    return ops[~(ops["start_us"].astype("float64") > float(times.min()))]


def _members(data: TriageInput) -> dict[str, list[int]]:
    return {pg: sorted(ranks) for pg, ranks in data.pg_ranks.items()}


def _first_desync(ops: pd.DataFrame) -> tuple[str, int] | None:
    """(pg, seq) of the earliest sequence number at which ranks issued different collectives."""
    if ops.empty:
        return None
    kinds = ops.groupby(["pg", "seq"], observed=True)["signature"].nunique()
    bad = kinds[kinds > 1]
    if bad.empty:
        return None
    starts = ops.set_index(["pg", "seq"])["start_us"].groupby(level=[0, 1]).min().loc[bad.index]
    pg, seq = min(bad.index, key=lambda key: (starts.get(key, float("inf")), key[0], key[1]))
    return str(pg), int(seq)


def _hangs(ops: pd.DataFrame, members: dict[str, list[int]], data: TriageInput) -> list[dict]:
    """Per group, the oldest collective pending on some rank, with the member ranks that never reached it;
    those with missing ranks first, oldest first."""
    candidates = []
    for pg, group in ops.groupby("pg", observed=True):
        last_seq = group.groupby("rank")["seq"].max()
        seqs = group.loc[~group["completed"], "seq"]
        starts = [int(seqs.min())] if len(seqs) else []
        never_issued = _first_seq_never_issued(group, last_seq, data)
        if never_issued is not None and (not data.completion_reliable or data.kind != "flight_recorder"):
            # gloo's last_completed_collective lags the entries: a lower seq every member issued may read
            # pending while it returned; the first seq some members never issued cannot have completed (in
            # diag's trace there is one only where the ops pending below it are such entries)
            starts = [never_issued]
        elif never_issued is not None:
            starts.append(never_issued)
        without_data = [r for r in members.get(str(pg), []) if not data.ranks.get(r, RankInfo(r)).has_data]
        if not data.completion_reliable and without_data and not starts:
            starts.append(int(last_seq.max()))  # the last op of gloo dumps may be the one that failed
        if not starts:
            continue
        seq = min(starts)
        at_seq = group[group["seq"] == seq]
        entered = sorted(at_seq["rank"].unique().tolist())
        inside = set(entered)  # once: a set per member made this quadratic (4.8 s at 16,384 ranks)
        missing = [r for r in members.get(str(pg), entered) if r not in inside and last_seq.get(r, -1) < seq]
        not_started = _not_started(at_seq) if not missing else []
        if not_started:  # their streams never reached it: for the others, they are as absent as a missing rank
            entered, missing = [r for r in entered if r not in not_started], not_started
        start_us = float(at_seq["start_us"].min())
        candidates.append(
            {
                "pg": str(pg),
                "seq": seq,
                "entered": entered,
                "missing": missing,
                "start_us": start_us,
                "not_started": not_started,
            }
        )
    return sorted(
        candidates,
        key=lambda c: (not c["missing"], c["start_us"] if c["start_us"] == c["start_us"] else float("inf"), c["pg"]),
    )


def _culprits_next(ops: pd.DataFrame, hangs: list[dict], roots: list[int], fallback: dict) -> dict:
    """The collective the culprits themselves never reached (the last link of a wait chain). Where they hold
    up several groups, the one they would have reached first: a step issues each group's collectives in the
    same order, so that is the group they issued to longest ago (not the one whose waiters entered first: on
    a loaded host the ranks of another group may get there sooner)."""
    theirs = [h for h in hangs if h["missing"] and set(h["missing"]) <= set(roots)]
    if not theirs:
        return fallback
    same = [h for h in theirs if h["missing"] == theirs[0]["missing"]]
    issued = ops[ops["rank"].isin(theirs[0]["missing"])].groupby("pg", observed=True)["start_us"].max()

    def issued_us(hang: dict) -> float:
        last_us = issued.get(hang["pg"], float("-inf"))  # never issued to: that group comes first
        return last_us if last_us == last_us else float("inf")  # unknown times: no reason to prefer it

    return min(same, key=issued_us)


def _first_seq_never_issued(group: pd.DataFrame, last_seq: pd.Series, data: TriageInput) -> int | None:
    """Flight Recorder dumps, or diag's trace where gloo's entries lag (``_lagging_below``): the first seq of
    the group that some members issued and others never did. A collective cannot complete without every
    member, whatever a dump says (gloo counts failed ops as completed); where completion is recorded (NCCL) and
    some member completed it, it was issued everywhere and only that member's dump is newer than the others'."""
    if last_seq.min() >= last_seq.max():
        return None
    seq = int(last_seq.min()) + 1
    if data.kind != "flight_recorder" and not _lagging_below(group, seq, data):
        return None
    if data.completion_reliable and group.loc[group["seq"] == seq, "completed"].any():
        return None
    return seq


def _lagging_below(group: pd.DataFrame, seq: int, data: TriageInput) -> bool:
    """In diag's trace: every op pending below ``seq`` is a gloo Flight Recorder entry past the rank's last
    row (DDP's buckets on gloo are read from Flight Recorder, with no row of diag's when they return), whose
    completion lags as in gloo's dumps: such an op may have returned (a rank that went on to wait for its next
    batch had it return), while the first seq some members never issued cannot have completed."""
    below = group[~group["completed"] & (group["seq"] < seq)]
    if below.empty:
        return False
    from_gloo_fr = below["source"].astype(str).str.startswith("flight_recorder") & below["rank"].map(
        lambda r: getattr(data.ranks.get(int(r)), "backend", None) == "gloo"
    )
    return bool(from_gloo_fr.all())


def _not_started(at_seq: pd.DataFrame) -> list[int]:
    """NCCL's Flight Recorder states: members whose copy of a collective is only ``scheduled`` while others'
    ``started``: their GPU stream never reached it (it is behind a kernel or another group's collective)."""
    if "state" not in at_seq:
        return []
    states = at_seq.groupby("rank")["state"].first().astype(str)
    if not states.isin(("started", "completed")).any():
        return []
    return sorted(int(r) for r, state in states.items() if state == "scheduled")


def _collective(ops: pd.DataFrame, pg: str, seq: int, ranks: list[int] | None = None) -> dict:
    rows = ops[(ops["pg"] == pg) & (ops["seq"] == seq)]
    if ranks is not None:
        rows = rows[rows["rank"].isin(ranks)]
    # diag's own rows first: their sizes read in bytes on every rank; Flight Recorder's as shapes
    rows = rows.assign(_fr=rows["source"].astype(str).str.startswith("flight_recorder"))
    first = rows.sort_values(["_fr", "rank"]).iloc[0] if len(rows) else None
    return {
        "pg": pg,
        "seq": seq,
        "op": None if first is None else str(first["op"]),
        "sizes": None if first is None else str(first["sizes"]),
        "dtype": None if first is None else str(first["dtype"]),
    }


# -- desync -----------------------------------------------------------------------------------------------------


def _desync_verdict(data: TriageInput, ops: pd.DataFrame, key: tuple[str, int], liveness: dict) -> Verdict:
    pg, seq = key
    ops = _collectives_only(ops)  # a pipeline's sends and receives share the group's numbers, not its ops
    at_seq = ops[(ops["pg"] == pg) & (ops["seq"] == seq)]
    sides = {sig: sorted(rows["rank"].tolist()) for sig, rows in at_seq.groupby("signature")}
    history = _issued_before(ops[(ops["pg"] == pg) & (ops["seq"] < seq)]["signature"], sides)
    # reference side: most ranks, then most issued before, then holding the lowest rank
    standing = {s: (len(sides[s]), history[s]) for s in sides}
    reference = max(sides, key=lambda s: (*standing[s], -min(sides[s])))
    culprits = sorted(r for s, ranks in sides.items() if s != reference for r in ranks)
    undecided = sum(1 for s in sides if standing[s] == standing[reference]) > 1
    if undecided:  # as many ranks on each side, each issued as often before: nothing says which side is wrong
        culprits = sorted(r for ranks in sides.values() for r in ranks)
    ranks = _rank_reports(data, ops, liveness, focus=(pg, seq))
    evidence = [f"ranks issued different collectives at {_where(pg, seq)}:"]
    for sig, side in sorted(sides.items(), key=lambda item: (item[0] != reference, min(item[1]))):
        row = at_seq[at_seq["rank"] == side[0]].iloc[0]
        site = _call_site(data, ops, side[0], pg, seq) or "call site unknown"
        role = "one side" if undecided else "expected" if sig == reference else "culprit"
        shape = f", shapes {row['shape']}" if sig.count("|") > 2 and row.get("shape") else ""
        evidence.append(f"  {role}: {_ranks_text(side)} called {row['op']} ({_payload(row)}{shape}) at {site}")
    if undecided:
        evidence.append(
            f"  (tie: {row_count_text(history, sides)}; as many ranks on each side, each issued as often before: "
            "the ranks of every side are named, and the code that gave them different collectives is the culprit)"
        )
    elif len(sides[reference]) == len(culprits):
        evidence.append(
            f"  (tie: {row_count_text(history, sides)}; the side issued less often before is named culprit)"
        )
    evidence += _step_divergence(data, ops, pg, seq)
    return _verdict("desync", culprits, _collective(ops, pg, seq, sides[reference]), ranks, evidence, data)


def _issued_before(earlier: pd.Series, sides: dict[str, list[int]]) -> dict[str, int]:
    """How often the group issued each side's collective before, from the earlier signatures: one matches at
    the precision it was recorded with (op, bytes and dtype; the shapes where both it and the side have them),
    since a failing collective's record can carry shapes that the same collective's earlier records lack."""
    counts = earlier.value_counts()
    base_and_shape = [(sig.split("|", 3)[:3], sig.split("|", 3)[3:]) for sig in counts.index]
    issued = {}
    for side in sides:
        base, shape = side.split("|", 3)[:3], side.split("|", 3)[3:]
        issued[side] = sum(
            int(n) for (b, s), n in zip(base_and_shape, counts) if b == base and (not s or not shape or s == shape)
        )
    return issued


def row_count_text(history: dict[str, int], sides: dict[str, list[int]]) -> str:
    return ", ".join(f"{sig.split('|')[0]} issued {history[sig]}× before" for sig in sorted(sides))


# -- hangs: missing or dead ranks ----------------------------------------------------------------------------------


def _hang_verdict(data: TriageInput, ops: pd.DataFrame, hangs: list[dict], liveness: dict) -> Verdict:
    hang = hangs[0]
    latest = not data.completion_reliable
    ops = _collectives_only(ops)  # the hang is a collective's: sends and receives share its numbers
    roots, links, cycle, waited_in = (
        _wait_chain(ops, _members(data), hang["missing"], latest, lambda rank: _gave_up_waiting_us(data, rank))
        if hang["missing"]
        else ([], [], False, [])
    )
    hang = _culprits_next(ops, hangs, roots, hang)
    others = [h for h in hangs if h is not hang and h["missing"]]
    pg, seq, missing = hang["pg"], hang["seq"], hang["missing"]
    ranks = _rank_reports(data, ops, liveness, focus=(pg, seq))
    collective = _collective(ops, pg, seq)
    waiting = hang["entered"]
    evidence = [
        f"{_ranks_text(waiting)} entered {collective['op']} ({_payload(collective)}) "
        f"at {_where(pg, seq)}"
        + (f" and never saw it complete; {_ranks_text(missing)} never reached it" if missing else "")
    ]
    if not missing:
        return _all_inside(data, ops, hang, ranks, liveness, evidence)
    if hang.get("not_started"):
        evidence[0] = (
            f"{_ranks_text(waiting)} started {collective['op']} ({_payload(collective)}) at {_where(pg, seq)}; "
            f"on {_ranks_text(missing)} it is only scheduled: their GPU stream never reached it "
            "(it waits behind an earlier kernel or another group's collective)"
        )
    # on a mesh: the dimension whose group the culprits hold up first (the hang's own, else one a rank
    # waiting for them gave up in)
    mesh_lines = next((lines for g in (pg, *waited_in) if (lines := _mesh_evidence(data, g, roots or missing))), [])
    evidence += links + mesh_lines
    for other in others:
        for rank in other["entered"]:
            if rank in ranks and rank not in missing and ranks[rank].state != "dead":
                ranks[rank].state = "waiting_in_collective"
                where = f"in {_collective(ops, other['pg'], other['seq'])['op']} at {_where(other['pg'], other['seq'])}"
                ranks[rank].detail = f"{where}; {ranks[rank].detail}" if ranks[rank].detail else where
    for other in others[:MAX_OTHER_HANGS]:
        dim = data.mesh.dim_of(other["pg"]) if data.mesh is not None else None
        evidence.append(
            f"also pending: {_ranks_text(other['entered'])} at {_where(other['pg'], other['seq'])}"
            + (f" (a {dim} group)" if dim else "")
            + f", waiting for {_ranks_text(other['missing'])}"
        )
    dead = [r for r in roots if _died_before(data.ranks[r], liveness.get(r), hang["start_us"])]
    waited = [t for r in waiting if (t := _gave_up_us(data, r)) is not None]
    for rank in sorted(set(missing) | set(roots)):
        _note_pending_elsewhere(ranks[rank], ops, rank, pg)
        silent = rank in roots and rank not in dead and _silent_through_the_wait(data, rank, hang["start_us"], waited)
        if silent:
            ranks[rank].state = "unresponsive"
        evidence.append(f"rank {rank}: {_describe(ranks[rank])}")
        if silent:
            evidence.append(_watchdog_silent_line(rank, data.ranks[rank], waited))
    evidence += _step_divergence(data, ops, pg, seq)
    victims = _gave_up_after_death(data, dead, [r for r in roots if r not in dead])
    if victims:
        evidence.append(
            f"{_ranks_text(victims)} gave up only after {_ranks_text(dead)} had died ({_gave_up_reason(data, victims[0])[:200]}): "
            "they waited for it"
        )
    if dead and len(dead) + len(victims) == len(roots):
        mismatch = _gloo_size_mismatch(data, ops, pg, seq, waiting, dead)
        if mismatch is not None:
            culprits, lines = mismatch
            evidence[0] = evidence[0].split("; ")[0] + f"; {_ranks_text(dead)} died inside it"
            return _verdict("desync", culprits, collective, ranks, evidence + lines, data)
        return _verdict("dead_rank", dead, collective, ranks, evidence, data)
    if cycle:
        return _verdict("deadlock", roots, collective, ranks, evidence, data)
    alive_first = [r for r in roots if r not in dead] + dead
    return _verdict("missing_ranks", alive_first, collective, ranks, evidence, data)


def _wait_chain(
    ops: pd.DataFrame,
    members: dict[str, list[int]],
    missing: list[int],
    latest: bool = False,
    gave_up_us: Callable[[int], float | None] | None = None,
) -> tuple[list[int], list[str], bool, list[str]]:
    """Follow missing ranks that are themselves waiting in another group's collective to the ranks at the
    end of the chain (not waiting in any collective): those are the culprits. A cycle (ranks waiting on each
    other across groups) makes every rank on it a culprit, and is said (the third value). ``latest``: where
    completion is not recorded (gloo's dumps), a rank waits in the last collective it issued, not in the
    oldest one that reads pending. ``gave_up_us``: when a rank gave up (a timeout); a rank nothing reads
    pending any more waited in the collective it was in then, for the members that entered only later.
    Fourth value: the groups the links wait in, first to last."""
    pending = ops[~ops["completed"]].sort_values(["start_us", "seq"], ascending=not latest)
    columns = (pending[c].tolist() for c in ("rank", "pg", "seq", "op"))  # not iterrows: a Series a rank
    waits_in: dict[int, list[tuple[str, int, str]]] = {}  # each rank's pending collectives, the likeliest first
    for r, pg, seq, op in zip(*columns, strict=True):
        waits_in.setdefault(int(r), []).append((str(pg), int(seq), str(op)))
    last_seq = ops.groupby(["pg", "rank"])["seq"].max().to_dict()
    keys = pending[["pg", "seq"]].drop_duplicates()
    inside = ops.merge(keys, on=["pg", "seq"])  # only the collectives someone waits in, not the whole history
    entered = set(zip(inside["pg"].astype(str), inside["seq"], inside["rank"], strict=True))
    roots, links, seen, frontier = set(), [], set(), list(missing)
    waits_for: dict[int, list[int]] = {}
    waited_in: list[str] = []

    def link_of(rank: int) -> tuple[str, str, list[int]] | None:
        """(what ``rank`` waits for, as evidence; the group it waits in; the ranks it waits for, none when the
        chain ends there though something is said); None: it waits for no rank."""
        gave_up = gave_up_us(rank) if gave_up_us else None
        if rank not in waits_in:
            found = _waited_for_latecomers(ops, members, rank, gave_up)
            if found is None:
                return None
            (pg, seq, op), late = found
            return _gave_up_text(rank, op, pg, seq, late), pg, late
        # the oldest pending first (the last issued where completion is not recorded); one that every member
        # entered in time is not what the rank waits for (a Flight Recorder row nothing timed reads pending
        # though it returned): the next one may be
        for pg, seq, op in waits_in[rank]:
            if pg not in members:  # gloo dumps describe only the default group: who else belongs is unknown
                text = (
                    f"{_ranks_text([rank])} is itself waiting in {op} at {_where(pg, seq)}, whose members are unknown"
                )
                return text, pg, []
            absent = [r for r in members[pg] if (pg, seq, r) not in entered and last_seq.get((pg, r), -1) < seq]
            if absent:
                return (
                    f"rank {rank} is itself waiting in {op} at {_where(pg, seq)} for {_ranks_text(absent)}",
                    pg,
                    absent,
                )
            late = _entered_late(ops, members[pg], rank, pg, seq, gave_up)  # everyone entered: in time?
            if late:
                return _gave_up_text(rank, op, pg, seq, late), pg, late
        return None

    while frontier:
        rank = frontier.pop()
        if rank in seen:
            continue
        seen.add(rank)
        link = link_of(rank)
        if link is not None:
            links.append(link[0])
        if link is None or not link[2]:
            roots.add(rank)
            continue
        _, pg, waited = link
        waits_for[rank] = waited
        waited_in.append(pg)
        frontier.extend(waited)
    if not roots:  # a cycle: nobody at the end of the chain; the culprits are the ranks on it
        on_cycle = _on_cycle(waits_for) or sorted(seen)
        links.append(f"{_ranks_text(on_cycle)} wait for each other across process groups (a deadlock)")
        return on_cycle, links, True, waited_in
    return sorted(roots), links, False, waited_in


def _gave_up_text(rank: int, op: str, pg: str, seq: int, late: list[int]) -> str:
    return (
        f"rank {rank} gave up waiting in {op} at {_where(pg, seq)}, which {_ranks_text(late)} entered only after that"
    )


def _waited_for_latecomers(
    ops: pd.DataFrame, members: dict[str, list[int]], rank: int, gave_up_us: float | None
) -> tuple[tuple[str, int, str], list[int]] | None:
    """The collective ``rank`` was in when it gave up (the last it entered before), and its members that
    entered it only after that or never: a wait that ended in a timeout, which gloo's dumps count as
    completed. None when it gave up on nothing, or everyone was there in time."""
    if gave_up_us is None:
        return None
    own = ops[(ops["rank"] == rank) & (ops["start_us"] <= gave_up_us)]
    if own.empty:
        return None
    last = own.sort_values(["start_us", "seq"]).iloc[-1]
    pg, seq = str(last["pg"]), int(last["seq"])
    if pg not in members:
        return None
    late = _entered_late(ops, members[pg], rank, pg, seq, gave_up_us)
    return ((pg, seq, str(last["op"])), late) if late else None


def _entered_late(
    ops: pd.DataFrame, members: list[int], rank: int, pg: str, seq: int, gave_up_us: float | None
) -> list[int]:
    """The ``members`` of ``pg`` other than ``rank`` that entered its collective ``seq`` only after ``rank`` gave
    up waiting in it, or never (none when nothing says when ``rank`` gave up)."""
    if gave_up_us is None:
        return []
    at_seq = ops[(ops["pg"] == pg) & (ops["seq"] == seq)]
    entered_us = at_seq.groupby("rank")["start_us"].min()
    return [r for r in members if r != rank and _later_or_never(entered_us.get(r), gave_up_us)]


def _later_or_never(entered_us: float | None, than_us: float) -> bool:
    return entered_us is None or (entered_us == entered_us and entered_us > than_us)


def _gloo_size_mismatch(
    data: TriageInput, ops: pd.DataFrame, pg: str, seq: int, waiting: list[int], dead: list[int]
) -> tuple[list[int], list[str]] | None:
    """gloo aborts a rank that receives more bytes than its own call expects ("Received data size doesn't match
    expected size. Is there a distributed collective mismatch in your code?"): the process ends in SIGABRT, its
    main thread inside the collective, its record of the call never written. Every dead rank aborted inside
    the op the others wait in is that mismatch. The culprits are the side whose collective the group never
    issued before: the waiting ranks when theirs is new, else the aborted ones (whose call went unrecorded)."""
    at_seq = ops[(ops["pg"] == pg) & (ops["seq"] == seq) & ops["rank"].isin(waiting)]
    op = str(at_seq["op"].iloc[0]) if len(at_seq) else ""
    # NCCL's watchdog also aborts a rank that timed out: only gloo's abort says the sizes differed
    if not op or not all(data.ranks[r].backend == "gloo" and _aborted_in(data.ranks[r], op) for r in dead):
        return None

    def payload(signatures: pd.Series) -> pd.Series:  # op|bytes|dtype, without the shapes only some rows have
        return signatures.str.split("|").str[:3].str.join("|")

    before = ops[(ops["pg"] == pg) & (ops["seq"] < seq) & (ops["op"].astype(str) == op)]
    history = payload(before["signature"]).value_counts()
    waiting_payloads = payload(at_seq["signature"]).unique().tolist()
    new_on_waiting = len(history) > 0 and all(int(history.get(p, 0)) == 0 for p in waiting_payloads)
    culprits = sorted(waiting) if new_on_waiting else sorted(dead)
    lines = [
        f"{_ranks_text(dead)} aborted (SIGABRT) inside {op} while {_ranks_text(waiting)} waited in it: gloo aborts a "
        "rank that receives a different size than its own call expects, so the ranks' collectives did not match"
    ]
    issued = ", ".join(
        f"{dtype} {nbytes} B {n}x" for (_, nbytes, dtype), n in ((p.split("|"), n) for p, n in history.head(3).items())
    )
    row = at_seq.iloc[0]
    if new_on_waiting:
        lines.append(
            f"{_ranks_text(waiting)} called {op} ({_payload(row)}), which this group never issued before "
            f"({op} issued before: {issued})"
        )
    else:
        lines.append(
            f"{_ranks_text(waiting)} called {op} ({_payload(row)}) as the group did before: the aborted ranks' "
            "call, never recorded, is the odd one"
        )
    return culprits, lines


def _aborted_in(info: RankInfo, op: str) -> bool:
    """faulthandler's record of a SIGABRT with the rank's main thread inside torch.distributed's ``op``."""
    stacks = info.fatal_stacks or ""
    return stacks.lstrip().startswith("Fatal Python error: Aborted") and bool(
        re.search(rf'distributed_c10d\.py", line \d+ in {re.escape(op)}\b', stacks)
    )


def _mesh_evidence(data: TriageInput, pg: str, culprits: list[int]) -> list[str]:
    """On a device mesh: which dimension's group the culprits hold up first (the oldest pending collective is
    the one the verdict names), and where they sit."""
    mesh = data.mesh
    dim = mesh.dim_of(pg) if mesh is not None else None
    if dim is None:
        return []
    where = "; ".join(f"rank {r} at {mesh.where(r)}" for r in culprits[:4] if mesh.where(r))
    return [
        f"process group {pg} is {mesh.group_text(pg)} in the device mesh ({mesh.shape_text()}): "
        f"{_ranks_text(culprits)} stall{'s' * (len(culprits) == 1)} that {dim} group first"
        + (f" ({where})" if where else "")
    ]


def _gave_up_after_death(data: TriageInput, dead: list[int], others: list[int]) -> list[int]:
    """Of ``others`` (ranks at the end of a wait chain, alive when the wait began), those that raised out of the
    job only after a rank of ``dead`` had vanished (its last heartbeat): a peer's connection closed under them, as
    in a pipeline's send or receive with the dead rank, which no collective row shows them waiting in."""
    deaths = [
        data.ranks[r].heartbeat.time_us
        for r in dead
        if data.ranks[r].heartbeat is not None and data.ranks[r].heartbeat.time_us
    ]
    if not deaths:
        return []
    died_us = min(deaths)
    return [r for r in others if (gave_up := _gave_up_us(data, r)) is not None and gave_up >= died_us]


def _on_cycle(waits_for: dict[int, list[int]]) -> list[int]:
    """Ranks that, following who waits for whom, come back to themselves (not those that only wait into a cycle)."""

    def reaches(start: int, target: int) -> bool:
        stack, visited = list(waits_for.get(start, [])), set()
        while stack:
            rank = stack.pop()
            if rank == target:
                return True
            if rank not in visited:
                visited.add(rank)
                stack.extend(waits_for.get(rank, []))
        return False

    return sorted(rank for rank in waits_for if reaches(rank, rank))


def _all_inside(data, ops, hang, ranks, liveness, evidence) -> Verdict:
    """Every member entered the pending collective: late after the others gave up (missing when the timeout
    fired), all stuck inside it (the transport), or in flight (slow)."""
    at_seq = ops[(ops["pg"] == hang["pg"]) & (ops["seq"] == hang["seq"])]
    entry_us = at_seq.groupby("rank")["start_us"].min()
    step_of = at_seq.groupby("rank")["step"].first()
    gave_up = {
        r: t for r in entry_us.index if (t := _gave_up_us(data, int(r), step_of.get(r), entry_us[r])) is not None
    }
    late = _entered_after_others_gave_up(entry_us, gave_up)
    collective = _collective(ops, hang["pg"], hang["seq"])
    if late:
        culprits, held_up = _late_for_another(data, late, entry_us)
        first_out = min(gave_up, key=gave_up.get)
        reason = _gave_up_reason(data, first_out)[:200]
        evidence[0] = (
            f"{_ranks_text([r for r in entry_us.index if r not in late])} entered {collective['op']} "
            f"({_payload(collective)}) at {_where(hang['pg'], hang['seq'])} and gave up on it; "
            f"{_ranks_text(late)} entered only after that"
        )
        evidence.append(f"rank {first_out} gave up at {_clock(gave_up[first_out])}: {reason}")
        timed_out = _first_timed_out(data, {r: t for r, t in gave_up.items() if r not in late})
        if timed_out is not None and timed_out != first_out:
            evidence.append(
                f"rank {timed_out} timed out at {_clock(gave_up[timed_out])}: {_gave_up_reason(data, timed_out)[:200]}"
            )
        others_gave_up = [t for r, t in gave_up.items() if r not in late]
        for rank in late:
            stall = data.ranks[rank].stall_dump if rank in data.ranks else None
            where = f"; earlier its watchdog saw: {stall.reason}" if stall and stall.reason else ""
            ranks[rank] = _late_report(ranks.get(rank), data.ranks.get(rank))
            _place_by_phase(ranks[rank], data, rank, gave_up[first_out])
            _note_caught(ranks[rank], data, rank, liveness)
            evidence.append(
                f"rank {rank} entered at {_clock(entry_us[rank])}, {(entry_us[rank] - gave_up[first_out]) / 1e6:.1f} s "
                f"after rank {first_out} gave up: it was not there when the timeout fired{where}"
            )
            if rank in data.ranks and _watchdog_silent(data.ranks[rank], others_gave_up):
                ranks[rank].state = "unresponsive"
                evidence.append(_watchdog_silent_line(rank, data.ranks[rank], others_gave_up))
        evidence += held_up
        return _verdict("missing_ranks", culprits, collective, ranks, evidence, data)
    members = _members(data).get(hang["pg"], sorted(entry_us.index))
    stuck = [r for r in members if r in gave_up or _stalled_in(data.ranks.get(r), hang["pg"], hang["seq"])]
    if len(stuck) == len(members) and not at_seq["completed"].any():
        evidence[0] += "; every member entered it in time and none completed it: no rank is missing"
        for rank in sorted(entry_us.index):
            evidence.append(f"rank {rank} entered at {_clock(entry_us[rank])}")
        backends = sorted({str(b) for i in data.ranks.values() if (b := getattr(i, "backend", None))})
        evidence.append(
            f"transport: backend {', '.join(backends) or 'unknown'}; a hang with every rank inside one collective "
            "is below PyTorch (network, NCCL): check NCCL_DEBUG=INFO logs and the links between these ranks' hosts"
        )
        return _verdict("collective_hang", [], collective, ranks, evidence, data)
    # after the check above: every member stalled inside before one died is a hang the death did not cause
    dead = [r for r in members if r in entry_us.index and liveness.get(r) == "vanished"]
    if dead and not at_seq["completed"].any():
        return _died_inside(collective, dead, ranks, evidence, data)
    last = at_seq.sort_values(["start_us", "rank"]).iloc[-1]
    slowest = int(last["rank"])
    evidence.append(
        f"all members entered it; rank {slowest} entered last, {_ms(last['start_us'] - at_seq['start_us'].min())} "
        "after the first: the others waited for it"
    )
    return _verdict("slow", [slowest], _collective(ops, hang["pg"], hang["seq"]), ranks, evidence, data)


def _late_for_another(data: TriageInput, late: list[int], entry_us: pd.Series) -> tuple[list[int], list[str]]:
    """Of the ranks late into the collective, those that were late only because they had waited, in an earlier
    collective, for another of them and given up (a broadcast's root waiting to send to a rank still computing,
    while the receivers went on to the next collective): they are not culprits. Returns the culprits (every
    late rank when each waited for another: a cycle) and a line for each rank left out. Read from every row
    with the failed ones: a root-based collective the receivers completed is still the one its root gave up in
    (``_drop_stale_pending`` reads it as stale)."""
    members = _members(data)
    ops = _collectives_only(_with_failed(_with_signature(data.ops), data.errors))
    victims, lines = [], []
    for rank in late:
        gave_up_us = _gave_up_waiting_us(data, rank)
        if gave_up_us is None or not gave_up_us < float(entry_us[rank]):
            continue
        waited = _waited_for_latecomers(ops, members, rank, gave_up_us)
        if waited is None or not set(waited[1]) <= set(late) - {rank}:
            continue
        (pg, seq, op), for_ranks = waited
        victims.append(rank)
        lines.append(
            f"rank {rank} was late because it had waited in {op} at {_where(pg, seq)} for {_ranks_text(for_ranks)} "
            f"and given up at {_clock(gave_up_us)}"
        )
    culprits = [r for r in late if r not in victims]
    return (culprits, lines) if culprits else (late, [])


def _died_inside(collective: dict, dead: list[int], ranks: dict, evidence: list[str], data: TriageInput) -> Verdict:
    """Every member entered the collective and some died inside it (no exit record: SIGKILL, the OOM killer):
    it could never complete, and the others waited for, or gave up on, the dead ranks."""
    evidence[0] += f"; {_ranks_text(dead)} died inside it, so it could never complete"
    evidence += [f"rank {rank}: {_describe(ranks[rank])}" for rank in dead if rank in ranks]
    return _verdict("dead_rank", dead, collective, ranks, evidence, data)


def _stopped_from_outside(data: TriageInput) -> bool:
    """Every rank was ended by a signal while making progress (no stall, or only stalls it completed steps
    after): a job stopped from outside (preemption, the launcher, a user). The signals reach the ranks a little
    apart, so some are caught inside a collective that the first-stopped ranks never reached: that is not a
    hang. Not when a rank recorded an error of its own: the job had failed before the signal came (a timeout or a
    closed connection the first signals cause in the others is no such error)."""
    with_data = [info for info in data.ranks.values() if info.has_data]
    if len(data.errors) and data.errors["error"].astype(str).map(is_own_error).any():
        return False
    return bool(with_data) and all(
        (_exit_record(info) or NO_EXIT).how == "terminated" and not _still_stalled(info) for info in with_data
    )


def _still_stalled(info: RankInfo) -> bool:
    """Its latest stall had not cleared by its last heartbeat: it completed no step after the stall."""
    if not info.stalls:
        return False
    stalled_after = info.last_stall.last_step if info.last_stall is not None else None
    last_step = (info.heartbeat or Heartbeat()).last_step
    return last_step is None or (stalled_after is not None and last_step <= stalled_after)


def _stopped_verdict(data: TriageInput, ops: pd.DataFrame, hangs: list[dict], members: dict, liveness: dict) -> Verdict:
    first = hangs[0]
    signalled = sorted(r for r, info in data.ranks.items() if info.has_data)
    inside = (
        f"at the signal, {_ranks_text(first['entered'])} {'was' if len(first['entered']) == 1 else 'were'} inside "
        f"{_collective(ops, first['pg'], first['seq'])['op']} at {_where(first['pg'], first['seq'])}, which the "
        "ranks stopped first never reached"
    )
    if any(info.stalls for info in data.ranks.values()):  # it stalled earlier and went on: slow, not hung
        verdict = _slow_or_fine(data, ops, members, liveness)
        verdict.evidence += [f"{_ranks_text(signalled)} ended by a signal while making progress, not hung", inside]
        return verdict
    ranks = _rank_reports(data, ops, liveness, focus=None)
    evidence = [
        f"{_ranks_text(signalled)} ended by a signal with no stall seen before it: a healthy job stopped from "
        "outside (preemption, the launcher, a user), not a hang",
        inside,
    ]
    return _verdict("no_problem", [], None, ranks, evidence, data)


def _gave_up_us(data: TriageInput, rank: int, step: int | None = None, entered_us: float | None = None) -> float | None:
    """When a rank gave up on the job's collectives (a timeout, a closed connection): its first collective that
    raised, caught or not, else (a collective with no error of its own: DDP's buckets) when the step it issued
    the collective in raised (the first error after it entered the collective, when only Flight Recorder saw
    the collective and its step is unknown), or when its process raised out of the job; None if it did none
    of these."""
    times = []
    failed = _collective_errors(data, rank)
    errors = data.errors
    if len(failed):
        times.append(float(failed["time_us"].iloc[0]))
    elif step is not None and step >= 0:
        raised = errors[(errors["rank"] == rank) & (errors["step"] == step) & errors["time_us"].notna()]
        times += [float(raised["time_us"].iloc[0])] if len(raised) else []
    elif entered_us is not None and entered_us == entered_us:
        raised = errors[(errors["rank"] == rank) & (errors["time_us"] >= entered_us)]
        times += [float(raised["time_us"].min())] if len(raised) else []
    info = data.ranks.get(rank)
    record = _exit_record(info) if info is not None else None
    if record and record.how == "exception" and record.time_us:
        times.append(float(record.time_us))
    return min(times) if times else None


def _gave_up_waiting_us(data: TriageInput, rank: int) -> float | None:
    """When a rank gave up waiting for its peers (a timeout, a closed connection); None when what it raised
    was its own error (its forward, its data): it then left the job, it was not kept waiting."""
    gave_up_us = _gave_up_us(data, rank)
    return None if gave_up_us is None or is_own_error(_gave_up_reason(data, rank)) else gave_up_us


def _gave_up_reason(data: TriageInput, rank: int) -> str:
    failed = _collective_errors(data, rank)
    if len(failed):
        return str(failed["error"].iloc[0])
    raised = data.errors[data.errors["rank"] == rank]
    if len(raised):
        return str(raised["error"].iloc[0])
    return str((_exit_record(data.ranks[rank]) or NO_EXIT).error or "an error")


def _first_timed_out(data: TriageInput, gave_up: dict[int, float]) -> int | None:
    """The first of these ranks whose error is a timeout. The first rank out may have raised something else
    (a peer that had timed out and exited closed its connection, and the error was recorded before the
    timeout's): the timeout is what says the late ranks were absent when it fired."""
    timed_out = [r for r in gave_up if TIMEOUT_PATTERN.search(_gave_up_reason(data, r))]
    return min(timed_out, key=gave_up.get) if timed_out else None


def _collective_errors(data: TriageInput, rank: int) -> pd.DataFrame:
    errors = data.errors
    return errors[(errors["rank"] == rank) & (errors["kind"] == "collective_error") & errors["time_us"].notna()]


def _entered_after_others_gave_up(entry_us: pd.Series, gave_up: dict) -> list[int]:
    late = []
    for rank, entered in entry_us.items():
        others = [t for other, t in gave_up.items() if other != rank]
        if others and entered == entered and entered > min(others):
            late.append(int(rank))
    return late


def _stalled_in(info: RankInfo | None, pg: str, seq: int) -> bool:
    """Its watchdog dumped a stall while this collective was pending on it."""
    pending = info.stall_dump.pending if info is not None and info.stall_dump else ()
    return any(str(p.pg) == str(pg) and p.seq == seq for p in pending)


def _late_report(report: RankReport | None, info: RankInfo | None) -> RankReport:
    """A rank that arrived after the timeout: where it was while the others waited, from its stall dump."""
    stall = info.stall_dump if info is not None else None
    frames = main_frames(stall)
    state = _classify(frames, stall.phase) if stall else "arrived_late"
    state = "arrived_late" if state == "unknown" else state
    detail = _exit_detail(info) if info is not None else ""
    stack = [f"{f.get('file')}:{f.get('line')} in {f.get('name')}" for f in frames]
    last_step = report.last_step if report is not None else None
    phase = stall.phase if stall else None
    return RankReport(state, last_step, phase, stack or (report.stack if report else []), detail)


def _place_by_phase(report: RankReport, data: TriageInput, rank: int, time_us: float) -> None:
    """A late rank no stall dump placed (the stall threshold was longer than its delay): the phase its phases
    table shows it in when the first rank gave up."""
    if report.state != "arrived_late" or data.phase_at is None:
        return
    phase = data.phase_at(rank, time_us)
    if phase:
        report.state = _classify([], phase)
        report.last_phase = phase
        report.detail = f"in phase {phase} when the timeout fired (its phases table); {report.detail}".rstrip("; ")


def _note_pending_elsewhere(report: RankReport, ops: pd.DataFrame, rank: int, pg: str) -> None:
    """A missing rank inside a collective of another group is stuck there (e.g. a lock-order inversion)."""
    elsewhere = ops[(ops["rank"] == rank) & ~ops["completed"] & (ops["pg"] != pg)]
    if elsewhere.empty or report.state == "dead":
        return
    first = elsewhere.sort_values(["start_us", "seq"]).iloc[0]
    report.state = "stuck_in_barrier" if first["op"] == "barrier" else "stuck_in_collective"
    where = f"waiting in {first['op']} seq {first['seq']} of process group {first['pg']}"
    report.detail = f"{where}; {report.detail}" if report.detail else where


def _died_before(info: RankInfo, state: str | None, waiting_since_us: float) -> bool:
    """Its process was gone, rather than alive somewhere else, when the others started waiting for it."""
    if state == "vanished":
        return True
    exit_record = _exit_record(info)
    if exit_record and exit_record.how in ("exception", "terminated", "exited_without_finish"):
        ended_us = exit_record.time_us or info.heartbeat.time_us or 0
        return ended_us < waiting_since_us
    return False


def _stalled_apart(data: TriageInput) -> tuple[list[int], list[int]] | None:
    """(ranks stalled waiting in communication, ranks that kept them waiting), from the watchdog's stall dumps:
    what shows a hang whose waits no collective row holds, as a pipeline's point-to-point sends and receives
    (numbered per rank, never pending under a group's sequence number). None unless both are there."""
    states: dict[int, tuple[str, int | None]] = {}
    for rank, info in data.ranks.items():
        dump = info.stall_dump
        if dump is not None and info.stalls:
            states[rank] = (_classify(main_frames(dump), dump.phase), dump.step)
    waiting = {r: step for r, (state, step) in states.items() if state in ("stuck_in_collective", "stuck_in_barrier")}
    if not waiting:
        return None
    # the culprit stalls in the step the others wait in, or one behind it: a pipeline has no barrier between
    # steps, so a stage that stalls in its optimizer step leaves its neighbours waiting in the next step's sends
    latest = max((s for s in waiting.values() if s is not None), default=None)
    elsewhere = [
        r
        for r, (state, s) in states.items()
        if state in ("stuck_in_compute", "stuck_in_data_loader")
        and (latest is None or s is None or latest - 1 <= s <= latest)
    ]
    if not elsewhere and len(states) == len(waiting):
        elsewhere = _frozen(data, states, list(waiting))
    return (sorted(waiting), sorted(elsewhere)) if elsewhere else None


def _frozen(data: TriageInput, stalled: dict, waiting: list[int]) -> list[int]:
    """Every rank with a stall dump stalled in communication: the ranks that wrote none stopped answering
    altogether (a process the node froze, its watchdog thread with it), unless they raised before the waiting
    ranks gave up (their exception is the failure, not a freeze)."""
    gave_up = [t for r in waiting if (t := _gave_up_us(data, r)) is not None]
    last_gave_up = max(gave_up) if gave_up else None
    return [
        r
        for r, info in data.ranks.items()
        if info.has_data
        and r not in stalled
        and (last_gave_up is None or (t := _gave_up_us(data, r)) is None or t >= last_gave_up)
    ]


def _stalled_apart_verdict(
    data: TriageInput, ops: pd.DataFrame, liveness: dict, waiting: list[int], culprits: list[int]
) -> Verdict:
    ranks = _rank_reports(data, ops, liveness, focus=None)
    for rank in waiting:
        ranks[rank].state = "waiting_in_collective"
    evidence = [
        f"no collective was left pending, but the watchdog's stall dumps show {_ranks_text(waiting)} waiting in "
        f"communication (point-to-point sends and receives, as a pipeline schedule's) while "
        f"{_ranks_text(culprits)} stalled outside it: the others waited for " + ("it" if len(culprits) == 1 else "them")
    ]
    gave_up = [t for r in waiting if (t := _gave_up_us(data, r)) is not None]
    for rank in culprits:
        info = data.ranks[rank]
        dump = info.stall_dump
        if dump is None or not info.stalls:
            ranks[rank].state = "unresponsive"
        elif _watchdog_silent(info, gave_up):
            ranks[rank].state = "unresponsive"
            evidence.append(_watchdog_silent_line(rank, info, gave_up))
        else:
            ranks[rank].state = _classify(main_frames(dump), dump.phase)
        evidence.append(f"rank {rank}: {_describe(ranks[rank])}")
    evidence += _caught_evidence(data)
    return _verdict("missing_ranks", culprits, None, ranks, evidence, data)


def _watchdog_silent(info: RankInfo, others_gave_up_us: list[float]) -> bool:
    """A live watchdog dumps within its threshold of a stall; this rank's first dump came only after every
    waiting rank had given up: the process was stopped (SIGSTOP, a frozen node) and ran again later."""
    first = info.first_stall_us
    return bool(others_gave_up_us) and first is not None and first >= max(others_gave_up_us)


def _watchdog_silent_line(rank: int, info: RankInfo, others_gave_up_us: list[float]) -> str:
    written = (
        f"its first stall dump was written at {_clock(info.first_stall_us)}"
        if info.first_stall_us is not None
        else "it wrote no stall dump"
    )
    return (
        f"rank {rank}: {written}, the others having given up at {_clock(max(others_gave_up_us))}: its watchdog "
        "did not run while they waited"
    )


def _silent_through_the_wait(data: TriageInput, rank: int, waiting_since_us: float, gave_up: list[float]) -> bool:
    """A rank the others waited for, whose watchdog (running: it has a heartbeat) stayed silent while they did:
    no stall dump before they gave up, though they waited longer than its threshold, and no error of its own
    before then (its exception would be the failure). A process the node stopped (SIGSTOP, a frozen node)."""
    info = data.ranks.get(rank)
    if info is None or info.heartbeat is None or not gave_up:
        return False
    exit_record = info.heartbeat.exit
    ended_us = (exit_record.time_us or info.heartbeat.time_us) if exit_record is not None else None
    if ended_us and ended_us < max(gave_up):  # its process had ended (diag.finish ran): nothing left to freeze
        return False
    if info.stalls and not _watchdog_silent(info, gave_up):
        return False
    threshold_s = info.heartbeat.threshold_s
    if threshold_s is None or waiting_since_us != waiting_since_us:
        return False
    if (max(gave_up) - waiting_since_us) / 1e6 < threshold_s:  # its watchdog had no time to see the stall
        return False
    own = _gave_up_us(data, rank)
    return own is None or own >= max(gave_up)


def _dead_without_hang(data: TriageInput, ops: pd.DataFrame, vanished: list[int], liveness: dict) -> Verdict:
    ranks = _rank_reports(data, ops, liveness, focus=None)
    evidence = [f"rank {r}: {_describe(ranks[r])}" for r in vanished]
    return _verdict("dead_rank", vanished, None, ranks, evidence, data)


# -- recorded errors: caught by the job, or from an earlier attempt --------------------------------------------------


def _error_verdict(data: TriageInput, ops: pd.DataFrame, liveness: dict) -> Verdict:
    """Errors recorded with no collective left pending (a step that raised before any collective failed, an OOM
    every rank hit): never "no problem". The culprits are the ranks that raised in the first failed step."""
    errors = data.errors
    first = errors.iloc[0]
    in_first_step = errors[errors["step"] == first["step"]] if first["step"] == first["step"] else errors.iloc[:1]
    raised = sorted(set(in_first_step["rank"].tolist()))
    culprits = _not_waiting_victims(in_first_step) or raised
    ranks = _rank_reports(data, ops, liveness, focus=None)
    evidence = [f"{_ranks_text(raised)} raised: {_error_text(first)}"]
    victims = [r for r in raised if r not in culprits]
    if victims:
        evidence.append(
            f"{_ranks_text(victims)} only gave up waiting for {_ranks_text(culprits)} afterwards (a timeout or a "
            "closed connection): not a cause"
        )
    evidence += [f"rank {r}: {_describe(ranks[r])}" for r in raised if r in ranks]
    return _verdict("step_error", culprits, None, ranks, evidence, data)


def _not_waiting_victims(errors: pd.DataFrame) -> list[int]:
    """The ranks whose first error in the step is the job's own (not a timeout or a closed connection, which a
    rank raises when a peer it waits for has failed), when such an error came first; [] otherwise. A pipeline
    stage that raises leaves its neighbour waiting in a send or receive, which times out in the same step."""
    firsts = errors.sort_values("time_us", kind="stable").groupby("rank", sort=False).head(1)
    own = firsts[~firsts["error"].astype(str).str.contains(COMMUNICATION_FAILURE_PATTERN)]
    if own.empty or own["time_us"].min() > firsts["time_us"].min():
        return []
    return sorted(int(r) for r in own["rank"])


def _caught_evidence(data: TriageInput) -> list[str]:
    """One line when ranks recorded errors and still ran diag.finish: the job caught them (or finished in a
    ``finally``), so no exit record tells of the failure; the verdict comes from the recorded errors."""
    errors = _this_attempt(data.errors, data)
    if not len(errors):
        return []
    finished = {
        r for r, info in data.ranks.items() if info.finished or (_exit_record(info) or NO_EXIT).how == "finished"
    }
    caught = sorted(set(errors["rank"].tolist()) & finished)
    if not caught:
        return []
    return [
        f"the job caught the error and finished: {_ranks_text(caught)} recorded {_errors_text(errors, first=False)} "
        "and then ran diag.finish (a try/except or finally around the loop); the verdict is the one the error "
        "would have given had it ended the job"
    ]


def _errors_text(errors: pd.DataFrame, first: bool = True) -> str:
    """'collective_error, step_error in step 5 (first: rank 0 collective_error ... : RuntimeError: ...)'."""
    kinds = ", ".join(dict.fromkeys(errors["kind"].astype(str)))
    steps = sorted({int(s) for s in errors["step"] if s == s})
    where = f" in step {steps[0]}" if len(steps) == 1 else f" in steps {steps[0]}-{steps[-1]}" if steps else ""
    return f"{kinds}{where}" + (f" (first: {_error_text(errors.iloc[0])})" if first else "")


def _error_text(error) -> str:
    step = f" in step {int(error['step'])}" if error["step"] == error["step"] else ""
    collective = ""
    if error["kind"] == "collective_error" and error["seq"] == error["seq"]:
        collective = f" ({error['op']} at {_where(str(error['pg']), int(error['seq']))})"
    when = f" at {_clock(error['time_us'])}" if error["time_us"] == error["time_us"] else ""
    kind = "exited by an exception raised outside any step" if error["kind"] == UNCAUGHT else error["kind"]
    return f"rank {int(error['rank'])} {kind}{step}{collective}{when}: {str(error['error'])[:300]}"


def _with_uncaught_exceptions(data: TriageInput) -> TriageInput:
    """``data`` with an error row for each rank whose process ended by an exception that left no recorded error
    (raised outside any step: a failed re-initialisation, the user's own set-up or evaluation code). A rank that
    died of an exception is a failure, whatever the others did after."""
    rows = []
    for rank, info in sorted(data.ranks.items()):
        exit_record = _exit_record(info)
        if exit_record is None or exit_record.how != "exception" or exit_record.time_us is None:
            continue
        own = data.errors[data.errors["rank"] == rank] if len(data.errors) else data.errors
        since_us = data.attempt_start_us.get(rank, float("-inf"))
        if len(own) and (own["time_us"] >= since_us).any():
            continue  # the exception is the one the rank recorded
        rows.append(
            {
                "rank": rank,
                "time_us": float(exit_record.time_us),
                "kind": UNCAUGHT,
                "error": exit_record.error or "an exception",
            }
        )
    if not rows:
        return data
    added = pd.DataFrame(rows).reindex(columns=ERROR_COLUMNS)
    errors = pd.concat([data.errors, added], ignore_index=True) if len(data.errors) else added
    errors = errors.astype({"rank": "int64", "time_us": "float64", "step": "float64", "seq": "float64"})
    errors = errors.sort_values(["time_us", "rank"], kind="stable").reset_index(drop=True)
    return dataclasses.replace(data, errors=errors)


def _split_attempts(data: TriageInput) -> tuple[TriageInput | None, TriageInput]:
    """A job restarted into the same directory (torchrun --max-restarts, a requeue) appends its records: the
    errors and rows from before a rank's latest diag.init are the earlier attempt's, and so are the hang dumps
    written then and the heartbeat the restart kept (``RankInfo.earlier``). (earlier attempt or None when no
    earlier attempt failed, latest attempt)."""
    errors, starts = data.errors, data.attempt_start_us
    if not starts:
        return None, data
    earlier_errors = pd.Series(False, index=errors.index)
    if len(errors):
        earlier_errors = errors["time_us"] < errors["rank"].map(starts).astype("float64")
    if not earlier_errors.any() and not _earlier_attempt_failed(data):
        return None, data
    ops_start = data.ops["rank"].map(starts).astype("float64")
    earlier_ops = (data.ops["start_us"].astype("float64") < ops_start).to_numpy()
    earlier = dataclasses.replace(
        data,
        ops=data.ops[earlier_ops].reset_index(drop=True),
        ranks=_earlier_attempt_ranks(data),
        errors=errors[earlier_errors.to_numpy()].reset_index(drop=True),
        attempt_start_us={},  # every record in it is its own attempt's
        notes=[
            *data.notes,
            f"judged from the earlier attempt's records (before diag.init ran again at {_clock(min(starts.values()))})",
        ],
    )
    latest = dataclasses.replace(
        data,
        ops=data.ops[~earlier_ops].reset_index(drop=True),
        errors=errors[~earlier_errors.to_numpy()].reset_index(drop=True),
    )
    return earlier, latest


def _earlier_attempt_failed(data: TriageInput) -> bool:
    """An earlier attempt's kept heartbeat shows a rank that did not end by diag.finish: killed (no exit
    record), stopped by a signal, or ended by an exception, or its dumps show a stall."""
    for info in data.ranks.values():
        earlier = info.earlier
        if earlier is None:
            continue
        if earlier.stalls:
            return True
        beat = earlier.heartbeat
        if beat is not None and (beat.exit is None or beat.exit.how != "finished"):
            return True
    return False


def _kept_earlier_heartbeats(data: TriageInput) -> bool:
    """The restart kept the earlier attempt's heartbeats (capture does; traces written before it did not)."""
    return any(info.earlier is not None and info.earlier.heartbeat is not None for info in data.ranks.values())


def _earlier_attempt_ranks(data: TriageInput) -> dict[int, RankInfo]:
    """Each rank as the earlier attempt left it: its kept heartbeat and the dumps written before the restart.
    A trace whose restart kept no heartbeat (written before capture kept them) has only the latest ones."""
    kept = _kept_earlier_heartbeats(data)
    ranks = {}
    for rank, info in data.ranks.items():
        earlier = info.earlier or RankInfo(rank)
        heartbeat = earlier.heartbeat if kept else info.heartbeat
        exit_record = heartbeat.exit if heartbeat is not None else None
        ranks[rank] = dataclasses.replace(
            earlier,
            heartbeat=heartbeat,
            finished=exit_record is not None and exit_record.how == "finished" if kept else info.finished,
            host=info.host,
            gpu=info.gpu,
            pid=(heartbeat.pid if heartbeat is not None and heartbeat.pid else None) or info.pid,
            backend=info.backend,
            has_data=info.has_data,
            earlier=None,
        )
    return ranks


def _this_attempt(errors: pd.DataFrame, data: TriageInput) -> pd.DataFrame:
    """The errors recorded since their rank's latest diag.init: an earlier attempt's say nothing of how the
    latest one ended (its exit record is gone)."""
    if not len(errors) or not data.attempt_start_us:
        return errors
    start_of = errors["rank"].map(data.attempt_start_us).astype("float64")
    return errors[~(errors["time_us"] < start_of).to_numpy()]


def _later_attempt_text(latest: TriageInput, verdict: Verdict) -> str:
    finished = all(
        info.finished or (_exit_record(info) or NO_EXIT).how == "finished"
        for info in latest.ranks.values()
        if info.has_data
    )
    outcome = "ran to diag.finish on every rank" if finished else f"was judged {verdict.verdict}"
    return (
        f"2 attempts wrote into this directory: the job was restarted (diag.init ran again at "
        f"{_clock(min(latest.attempt_start_us.values()))}) and the later attempt {outcome}; this verdict is the "
        "first attempt's failure"
    )


# -- slow or fine ---------------------------------------------------------------------------------------------------


def _slow_or_fine(data: TriageInput, ops: pd.DataFrame, members: dict, liveness: dict) -> Verdict:
    ranks = _rank_reports(data, ops, liveness, focus=None)
    stalled = sorted(r for r, info in data.ranks.items() if info.stalls)
    if stalled:
        evidence = [f"rank {r}: watchdog saw a stall ({data.ranks[r].stalls[0]}) that later cleared" for r in stalled]
        kept_waiting = _kept_waiting(data, stalled)
        slowest = _slowest_by_steps(data, kept_waiting or None)
        slowest = slowest if slowest is not None else (kept_waiting or stalled)[0]
        if kept_waiting:
            evidence.append(
                f"{_ranks_text(stalled)} stalled waiting in a collective of a group whose other members "
                f"({_ranks_text(kept_waiting)}) they waited for; slowest of those by step time outside "
                f"communication: {slowest}"
            )
        else:
            evidence.append(f"slowest rank by mean step time outside communication: {slowest}")
        return _verdict("slow", [slowest], None, ranks, evidence, data)
    has_evidence = len(ops) or any(i.heartbeat or i.last_dump or i.fr_last for i in data.ranks.values())
    if not has_evidence:
        evidence = [NOTHING_TO_JUDGE]
        return _verdict("no_problem", [], None, ranks, evidence, data)
    evidence = ["every collective seen completed on every rank that issued it"]
    signalled = sorted(r for r, info in data.ranks.items() if (_exit_record(info) or NO_EXIT).how == "terminated")
    if signalled:
        evidence.append(
            f"{_ranks_text(signalled)} ended by a signal while nothing was pending or stalled: a healthy job "
            "stopped from outside (preemption, the launcher, a user), not a hang"
        )
    evidence += [f"{n} {'rank' if n == 1 else 'ranks'} {state}" for state, n in _count_states(ranks).items()]
    stopped = _capture_stopped(data)
    if stopped:
        lines = [_capture_stopped_line(rank, data.ranks[rank]) for rank in stopped]
        evidence[0] = f"in what was recorded, {evidence[0]}"
        return _verdict("capture_stopped", stopped, None, ranks, lines + evidence, data)
    unread = sorted(r for r, info in data.ranks.items() if not info.has_data)
    if unread and len(unread) < len(data.ranks):
        return _verdict("incomplete", unread, None, ranks, [_unread_line(data, unread), *evidence], data)
    return _verdict("no_problem", [], None, ranks, evidence, data)


def _unread_line(data: TriageInput, unread: list[int]) -> str:
    """Why nothing of these ranks was read: their directories' reasons in the skipped list, else missing."""
    marks = {f"rank{r:05d}" for r in unread}
    reasons = [s.reason for s in data.skipped if any(m in str(getattr(s, "path", s)) for m in marks)]
    why = (
        f" ({reasons[0][:200]})"
        if reasons
        else " (no rank directory: the rank never reached diag.init, or it was removed)"
    )
    return (
        f"nothing of {_ranks_text(unread)} could be read{why}: the other ranks show no problem, which says nothing "
        f"of {'it' if len(unread) == 1 else 'them'}"
    )


def _fr_problem_verdict(data: TriageInput, ops: pd.DataFrame, liveness: dict) -> Verdict:
    """What Flight Recorder's entries show beyond the (pg, seq) table: a send/recv pair or an all_to_all
    whose sizes disagree (desync), a send or recv whose peer never issued its counterpart (missing_ranks)."""
    desyncs = [p for p in data.fr_problems if p.verdict == "desync"]
    problem = min(desyncs or data.fr_problems, key=lambda p: (p.start_us, p.pg, p.seq))
    focus = (problem.pg, problem.seq) if problem.op not in (*P2P_OPS, "send/recv") else None
    ranks = _rank_reports(data, ops, liveness, focus=focus)
    evidence = list(problem.evidence)
    for rank, op in problem.waiting.items():
        if rank in ranks:
            ranks[rank].state = "waiting_in_collective"
            ranks[rank].detail = f"in {op} of process group {problem.pg}"
    for rank in problem.culprits:
        if rank in ranks and problem.verdict == "missing_ranks":
            evidence.append(f"rank {rank}: {_describe(ranks[rank])}")
    collective = {
        "pg": problem.pg,
        "seq": problem.seq,
        "op": problem.op,
        "sizes": problem.sizes,
        "dtype": problem.dtype,
    }
    return _verdict(problem.verdict, problem.culprits, collective, ranks, evidence, data)


def _capture_stopped(data: TriageInput) -> list[int]:
    """Ranks whose capture stopped mid-run: the manifest says so, or only the last heartbeat could."""
    return sorted(
        rank
        for rank, info in data.ranks.items()
        if info.capture_stopped is not None or (info.heartbeat is not None and info.heartbeat.state == CAPTURE_STOPPED)
    )


def _capture_stopped_line(rank: int, info: RankInfo) -> str:
    stopped = info.capture_stopped
    step = stopped.step if stopped is not None else info.heartbeat.step if info.heartbeat else None
    at = f" at step {step}" if step is not None else ""
    why = f" ({stopped.reason})" if stopped is not None else ""
    return f"rank {rank}: capture stopped{at}{why}; nothing after it was recorded, so what the rank did then is unknown"


def _kept_waiting(data: TriageInput, stalled: list[int]) -> list[int]:
    """The members of the groups the stalled ranks' watchdogs saw them waiting in (a collective pending in
    their stall dumps) that were not stalled in it themselves: whom they waited for. A rank stopped whole
    (SIGSTOP, a frozen node) writes no stall dump of its own."""
    waiting: dict[tuple[str, int], set[int]] = {}
    for rank in stalled:
        dump = data.ranks[rank].last_stall
        for pending in dump.pending if dump is not None else []:
            if pending.peer is None and pending.pg is not None and pending.seq is not None:
                waiting.setdefault((str(pending.pg), int(pending.seq)), set()).add(rank)
    members = _members(data)
    kept = set()
    for (pg, _seq), waiters in waiting.items():
        kept |= set(members.get(pg, [])) - waiters - set(stalled)
    return sorted(kept)


def _slowest_by_steps(data: TriageInput, among: list[int] | None = None) -> int | None:
    """In data parallelism all ranks take the same step time; the slow one is the one the others wait for:
    the largest step time outside communication (``among``: of these ranks only)."""
    steps = data.all_steps()
    if steps is None or steps.empty:
        return None
    if among is not None:
        steps = steps[steps["rank"].isin(among)]
        if steps.empty:
            return None
    own_us = (steps["duration_us"] - steps["comm_wait_us"]).groupby(steps["rank"]).mean()  # mean: one slow step counts
    return int(own_us.idxmax()) if len(own_us) else None


# -- per-rank states ----------------------------------------------------------------------------------------------


def _liveness(data: TriageInput) -> dict[int, str]:
    """finished / exited / running / vanished / unknown, from heartbeats and exit records."""
    freshest_us = max((info.heartbeat.time_us or 0) if info.heartbeat else 0 for info in data.ranks.values())
    anyone_exited = any(_exit_record(info) or info.finished for info in data.ranks.values())
    states = {}
    for rank, info in data.ranks.items():
        heartbeat = info.heartbeat
        if info.finished or (_exit_record(info) or NO_EXIT).how == "finished":
            states[rank] = "finished"
        elif _exit_record(info):
            states[rank] = "exited"
        elif not heartbeat or heartbeat.state == CAPTURE_STOPPED or info.capture_stopped is not None:
            # a heartbeat that stopped with capture says nothing of the process; NCCL RAS may: it could not
            # reach the process for 60 s (a heartbeat still beating says otherwise, and wins)
            states[rank] = "vanished" if info.ras_dead else "unknown"
        else:
            interval_us = float(heartbeat.interval_s or DEFAULT_HEARTBEAT_INTERVAL_S) * 1e6
            stale = freshest_us - (heartbeat.time_us or 0) > DEAD_MARGIN_INTERVALS * interval_us
            live = _now_us() - freshest_us < DEAD_MARGIN_INTERVALS * interval_us  # the job still beats
            if stale or anyone_exited:
                states[rank] = "vanished"
            else:  # every heartbeat stopped at once: the whole job was killed, nobody in particular died
                states[rank] = "running" if live else "stopped"
    return states


def _now_us() -> float:
    import time

    return time.time() * 1e6


def _exit_record(info: RankInfo) -> ExitRecord | None:
    return info.heartbeat.exit if info.heartbeat else None


def _rank_reports(data: TriageInput, ops: pd.DataFrame, liveness: dict, focus) -> dict[int, RankReport]:
    entered = set()
    if focus is not None:
        entered = set(ops[(ops["pg"] == focus[0]) & (ops["seq"] == focus[1])]["rank"].tolist())
    reports = {
        rank: _rank_report(info, liveness.get(rank), rank in entered, focus is not None)
        for rank, info in data.ranks.items()
    }
    if focus is not None and "failed" in ops:
        failed = ops[(ops["pg"] == focus[0]) & (ops["seq"] == focus[1]) & ops["failed"]]["rank"]
        for rank in set(failed.tolist()) & set(reports):
            if reports[rank].state == "finished":  # it gave up in the collective, then the job caught the error
                reports[rank].state = "waiting_in_collective"
    for rank, report in reports.items():
        _note_caught(report, data, rank, liveness)
        info = data.ranks[rank]
        if info.ras and info.has_data and info.ras not in report.detail:  # what NCCL RAS says of it
            report.detail = f"{report.detail}; {info.ras}" if report.detail else info.ras
    return reports


def _note_caught(report: RankReport, data: TriageInput, rank: int, liveness: dict) -> None:
    """A rank that recorded an error and still finished: the job caught it. Say what it caught, and where."""
    if liveness.get(rank) != "finished" or not len(data.errors):
        return
    errors = _this_attempt(data.errors[data.errors["rank"] == rank], data)
    if errors.empty:
        return
    caught = f"{_error_text(errors.iloc[0])}; the job caught the error and finished (diag.finish ran)"
    exit_text = "finished normally"  # what _exit_detail says of it: the error is what matters
    if exit_text in report.detail:
        report.detail = report.detail.replace(exit_text, caught)
    else:
        report.detail = f"{report.detail}; {caught}" if report.detail else caught


def _rank_report(info: RankInfo, alive: str | None, entered_focus: bool, has_focus: bool) -> RankReport:
    if not info.has_data:
        if info.ras:
            return RankReport("dead" if info.ras_dead else "no_data", detail=f"no trace or dump; {info.ras}")
        return RankReport("no_data", detail="no trace or dump for this rank")
    dump = info.stall_dump or info.last_dump
    heartbeat = info.heartbeat or Heartbeat()
    # during a stall the dump saw the step as it was; the heartbeat at exit counts a failed step as done
    last_step = _first_int(dump.last_step if dump else None, heartbeat.last_step)
    phase = dump.phase if dump else heartbeat.phase
    frames = main_frames(dump)
    stack = [f"{f.get('file')}:{f.get('line')} in {f.get('name')}" for f in frames]
    where = _classify(frames, phase)
    if info.fr_last is not None and not frames:  # Flight Recorder input: its last collective is all we know
        return _fr_rank_report(info.fr_last, entered_focus, has_focus)
    if alive == "vanished":
        return RankReport("dead", last_step, phase, stack, _death_detail(info))
    state = "waiting_in_collective" if entered_focus and alive != "finished" else where
    if alive == "finished" or (not entered_focus and alive == "exited" and info.stall_dump is None):
        state = alive  # a finished rank's old stall is history; an exit not seen stuck says nothing of where
    elif not has_focus and alive == "exited" and not info.stalls:
        # nothing pending and never stalled: the dump at the signal shows where it was, not that it was stuck
        state = "terminated" if (_exit_record(info) or NO_EXIT).how == "terminated" else "exited"
    detail = _exit_detail(info)
    return RankReport(state, last_step, phase, stack, detail)


def _fr_rank_report(last: dict, entered_focus: bool, has_focus: bool) -> RankReport:
    """A dump tells which collective a rank issued last, not where the rank is now."""
    state = "not_in_a_collective" if has_focus else "all_collectives_done"
    state = "waiting_in_collective" if entered_focus else state
    site = f" from {last['call_site']}" if last.get("call_site") else ""
    done = "" if last["completed"] else " (not completed)"
    detail = f"last collective issued: {last['op']} seq {last['seq']} in group {last['pg']}{site}{done}"
    return RankReport(state, None, None, [], detail)


def _classify(frames: list[dict], phase: str | None) -> str:
    """Where a rank's main thread is, from its stack (innermost frames win) and its phase."""
    for frame in reversed(frames):
        name, filename = str(frame.get("name")), str(frame.get("file"))
        if name in BARRIER_FUNCTIONS:
            return "stuck_in_barrier"
        if filename.endswith("distributed_c10d.py") or name == "wait" and "distributed" in filename:
            return "stuck_in_collective"
        if filename.endswith("_functional_collectives.py"):  # DTensor's: waited for where its result is used
            return "stuck_in_collective"
        if "p2p" in name and "distributed" in filename:  # torch.distributed.pipelining's _wait_batch_p2p
            return "stuck_in_collective"
        if "torch/utils/data" in filename or name in DATA_LOADER_FUNCTIONS:
            return "stuck_in_data_loader"
    if phase == "data_wait":
        return "stuck_in_data_loader"
    return "stuck_in_compute" if frames or phase else "unknown"


def _death_detail(info: RankInfo) -> str:
    heartbeat = info.heartbeat or Heartbeat()
    when = heartbeat.time_us
    text = "process gone: heartbeat stopped"
    if when:
        text += f" at {_clock(when)} (± {heartbeat.interval_s if heartbeat.interval_s is not None else '?'} s)"
    text += " with no exit record"
    if info.fatal_stacks:
        first = info.fatal_stacks.strip().splitlines()[0]
        text += f"; faulthandler: {first}"
    elif info.ras_dead and not heartbeat.time_us:
        return info.ras
    else:
        text += ": killed by SIGKILL, the OOM killer, or a crash outside Python"
    return text


def _exit_detail(info: RankInfo) -> str:
    record = _exit_record(info)
    if not record:
        return ""
    how = record.how
    when = f" at {_clock(record.time_us)}" if record.time_us else ""
    if how == "terminated":
        return f"terminated by {record.signal}{when}"
    if how == "exception":
        return f"exited with {str(record.error)[:300]}{when}"
    if how == "exited_without_finish":
        return f"exited without diag.finish{when}"
    return "finished normally" if how == "finished" else str(how)


def _describe(report: RankReport) -> str:
    parts = [report.state.replace("_", " ")]
    if report.last_step is not None:
        parts.append(f"last completed step {report.last_step}")
    if report.last_phase:
        parts.append(f"phase {report.last_phase}")
    site = _user_frame(report.stack)
    if site:
        parts.append(f"at {site}")
    if report.detail:
        parts.append(report.detail)
    return "; ".join(parts)


def _user_frame(stack: list[str]) -> str:
    for entry in reversed(stack):
        if not is_library_file(entry):
            return entry
    return stack[-1] if stack else ""


def _call_site(data: TriageInput, ops: pd.DataFrame, rank: int, pg: str, seq: int) -> str:
    rows = ops[(ops["rank"] == rank) & (ops["pg"] == pg) & (ops["seq"] == seq)]
    site = str(rows["call_site"].iloc[0]) if len(rows) else ""
    if site:
        return site
    info = data.ranks.get(rank)
    frames = main_frames(info.stall_dump or info.last_dump) if info else []
    return _user_frame([f"{f.get('file')}:{f.get('line')} in {f.get('name')}" for f in frames])


def _step_divergence(data: TriageInput, ops: pd.DataFrame, pg: str, seq: int) -> list[str]:
    """Ranks that issued one seq in different steps skipped (or added) collectives in an earlier step: from the
    first such seq, which the earlier rows of ranks judged from their heartbeats may hold (read when found)."""
    if _first_divergent_seq(ops, pg, seq) is None:
        return []
    history = data.ops_history()
    first = _first_divergent_seq(history, pg, seq)
    rows = history[(history["pg"] == pg) & (history["seq"] == first) & (history["step"] >= 0)]
    by_step = {int(s): sorted(set(g["rank"].tolist())) for s, g in rows.groupby("step")}
    described = ", ".join(f"{_ranks_text(r)} in step {s}" for s, r in sorted(by_step.items()))
    return [
        f"from seq {first} on, ranks issued the same collective in different steps ({described}): "
        "a rank skipped or added collectives in an earlier step"
    ]


def _first_divergent_seq(ops: pd.DataFrame, pg: str, seq: int) -> int | None:
    """The lowest seq of ``pg`` up to ``seq`` that ranks issued in different steps (None: none)."""
    known = ops[(ops["pg"] == pg) & (ops["seq"] <= seq) & (ops["step"] >= 0)]
    if known.empty:
        return None
    steps = known.groupby("seq")["step"].nunique()
    diverged = steps[steps > 1]
    return None if diverged.empty else int(diverged.index.min())


def _verdict(kind, culprits, collective, ranks, evidence, data: TriageInput) -> Verdict:
    skipped = [str(s) for s in data.skipped]
    caught = _caught_evidence(data)
    evidence = evidence + caught + _nccl_evidence(data, collective, culprits) + list(data.notes)
    return Verdict(kind, [int(r) for r in culprits], collective, ranks, evidence, skipped, errors_caught=bool(caught))


def _nccl_evidence(data: TriageInput, collective: dict | None, culprits) -> list[str]:
    """NCCL's own logs on the group the verdict is about (its transport, the members' networks and NCCL's
    warnings), or on the culprits when there is no collective. Nothing without nccl.log files."""
    if not data.nccl_logs:
        return []
    pg = collective.get("pg") if collective else None
    members = data.pg_ranks.get(pg) if pg is not None else None
    return group_evidence(data.nccl_logs, pg, list(members or culprits or data.nccl_logs))


def _count_states(ranks: dict[int, RankReport]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for report in ranks.values():
        counts[report.state] = counts.get(report.state, 0) + 1
    return counts


def _first_int(*values) -> int | None:
    for value in values:
        if value is not None and value == value:
            return int(value)
    return None


def _payload(collective) -> str:
    sizes, dtype = collective["sizes"], collective["dtype"]
    if str(sizes) in ("0 B", "-", "") and not dtype:
        return "no data"
    return f"{sizes}, {dtype}" if dtype else str(sizes)


def _where(pg: str, seq: int) -> str:
    return f"seq {seq} of process group {pg}"


def _ranks_text(ranks: list[int], limit: int = 16) -> str:
    """'rank 3' or 'ranks 0, 2, ...'."""
    ranks = sorted(ranks)
    shown = ", ".join(map(str, ranks[:limit]))
    more = f", ... ({len(ranks)} ranks)" if len(ranks) > limit else ""
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {shown}{more}"


def _ms(delta_us: float) -> str:
    return f"{delta_us / 1000:.1f} ms"


def _clock(time_us: float) -> str:
    import datetime

    return (
        datetime.datetime.fromtimestamp(time_us / 1e6, tz=datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3] + " UTC"
    )
