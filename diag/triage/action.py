"""What to do next about a verdict: fix the code, restart the job, or evict a host or GPU, with why.

A scheduler or the engineer on call acts on one of four answers, each with the hosts and GPUs it concerns:

* ``fix_code``: the job itself is wrong. Its ranks issued different collectives (desync), wait for each other
  across process groups (deadlock), raised an error with nothing pending, or one rank's own code (its data
  loader, its compute: its stack says where) kept it from a collective the others waited in. A restart fails
  again.
* ``restart``: nothing points at the code or the hardware. A rank killed by a signal without an error of its
  own (the kernel's OOM killer, the scheduler, a node that went away), a hang inside a collective every member
  entered (the network or NCCL). A restart is the cheap try; the same host again is the case for evicting it.
* ``evict``: the evidence names hardware: an error that only a GPU gives (an uncorrectable ECC error, an XID,
  a GPU fallen off the bus), or a rank whose process stopped answering altogether (neither its watchdog thread
  dumped its stack nor its heartbeat went on while the others waited: a process the node froze).
* ``none``: no problem, or a job that is only slow.

Computed from the verdict and the triage input, never from torch; the text, the JSON and ``--watch`` show it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diag.triage.errors import is_own_error

FIX_CODE, RESTART, EVICT, NONE = "fix_code", "restart", "evict", "none"
MAX_NAMED = 8  # hosts or GPUs named; the verdict's ranks list the rest
# error texts only failing GPU hardware gives (CUDA's and NVIDIA's driver's wording)
HARDWARE_ERRORS = re.compile(
    r"uncorrectable ECC|ECC error|\bXid\b|fallen off the bus|GPU is lost|cudaErrorECCUncorrectable|"
    r"unrecoverable (?:hardware|GPU)|NVLink error|row remapping",
    re.IGNORECASE,
)


@dataclass
class Action:
    kind: str  # fix_code | restart | evict | none
    why: str
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"action": self.kind, "hosts": self.hosts, "gpus": self.gpus, "action_why": self.why}


def decide(verdict, data) -> Action:
    """The action for ``verdict`` (triage.analysis.Verdict) judged from ``data`` (sources.TriageInput)."""
    culprits = list(verdict.culprit_ranks)
    kind = verdict.verdict
    if kind in ("no_problem", "slow", "capture_stopped", "incomplete"):
        why = "nothing to act on: the job is progressing" if kind == "slow" else "nothing to act on"
        return Action(NONE, why)
    hardware = _hardware_error(data, culprits)
    if hardware is not None:
        rank, text = hardware
        return _on(EVICT, f"rank {rank} reported an error only failing GPU hardware gives: {text}", data, [rank])
    if kind in ("desync", "deadlock"):
        what = "issued different collectives" if kind == "desync" else "wait for each other across process groups"
        return _on(FIX_CODE, f"the ranks {what}: the code takes different paths on different ranks", data, culprits)
    if kind == "step_error":
        return _on(FIX_CODE, "a rank raised an error with no collective left pending: the job's own failure", data,
                   culprits)  # fmt: skip
    if kind == "dead_rank":
        return _dead_rank(data, culprits)
    if kind == "collective_hang":
        members = sorted(verdict.ranks)
        return _on(RESTART, "every member entered the collective and none completed it: the network or NCCL, not "
                   "the code; the same hosts again are the case for evicting them", data, members)  # fmt: skip
    if kind == "missing_ranks":
        return _missing_ranks(verdict, data, culprits)
    return _on(RESTART, f"no rule for a {kind} verdict: restart and triage again if it recurs", data, culprits)


def _dead_rank(data, culprits: list[int]) -> Action:
    raised = [r for r in culprits if _exit_how(data, r) == "exception"]
    if raised:
        return _on(FIX_CODE, f"rank {raised[0]} died of an exception of its own: the job's failure", data, raised)
    exited = [r for r in culprits if _exit_how(data, r) == "exited_without_finish"]
    if exited:
        return _on(FIX_CODE, f"rank {exited[0]}'s process exited on its own (sys.exit in a handler, the end of the "
                   "script) without diag.finish while the others still needed it: the job's code ended it", data,
                   exited)  # fmt: skip
    return _on(RESTART, "killed without an error of its own (the OOM killer, the scheduler, the node): restart; "
               "the same host again is the case for evicting it", data, culprits)  # fmt: skip


def _missing_ranks(verdict, data, culprits: list[int]) -> Action:
    unanswering = [r for r in culprits if _stopped_answering(verdict, data, r)]
    if unanswering:
        return _on(EVICT, f"rank {unanswering[0]}'s process stopped answering (its watchdog wrote no stack while "
                   "the others waited): a process the node froze", data, unanswering)  # fmt: skip
    raised = [r for r in culprits if _raised_own_error(data, r)]
    if raised:
        return _on(FIX_CODE, f"rank {raised[0]} raised an error of its own before it reached the collective the "
                   "others waited in: the job's failure", data, raised)  # fmt: skip
    states = {verdict.ranks[r].state for r in culprits if r in verdict.ranks}
    if states & {"finished"}:
        return _on(FIX_CODE, "a rank ran diag.finish while the others waited in a collective: its loop ended early "
                   "(an error it caught, fewer batches than the others)", data, culprits)  # fmt: skip
    if states & {"stuck_in_data_loader"}:
        return _on(FIX_CODE, "a rank waited for its data loader while the others waited for it: the input "
                   "pipeline or its storage", data, culprits)  # fmt: skip
    if states & {"stuck_in_compute", "arrived_late", "stuck_in_barrier", "stuck_in_collective"}:
        return _on(FIX_CODE, "a rank's own work kept it from the collective the others waited in (its stack "
                   "says where)", data, culprits)  # fmt: skip
    return _on(RESTART, "a rank never reached the collective and nothing says why: restart, and triage again "
               "with Flight Recorder on (diag doctor) if it recurs", data, culprits)  # fmt: skip


def _stopped_answering(verdict, data, rank: int) -> bool:
    """The rank's process stopped as a whole: its own watchdog thread dumped no stack for the stall the others
    dumped for, and it is neither dead nor finished."""
    info = data.ranks.get(rank)
    report = verdict.ranks.get(rank)
    if info is None or report is None or report.state in ("dead", "finished", "exited", "terminated"):
        return False
    if report.state == "unresponsive":  # triage saw its watchdog silent while the others waited
        return True
    if info.stall_dump is not None or info.fatal_stacks or not info.has_data:
        return False
    return any(i.stall_dump is not None for r, i in data.ranks.items() if r != rank)


def _hardware_error(data, ranks: list[int]) -> tuple[int, str] | None:
    texts = []
    for rank in ranks:
        info = data.ranks.get(rank)
        beat = getattr(info, "heartbeat", None)
        exit_record = getattr(beat, "exit", None)
        texts += [(rank, getattr(exit_record, "error", None)), (rank, getattr(exit_record, "traceback", None))]
    errors = getattr(data, "errors", None)
    if errors is not None and len(errors) and "rank" in errors:
        for row in errors[errors["rank"].isin(ranks)].itertuples(index=False):
            texts.append((int(row.rank), " ".join(str(v) for v in row if isinstance(v, str))))
    for rank, text in texts:
        match = HARDWARE_ERRORS.search(text or "")
        if match:
            return rank, _around(text, match)
    return None


def _around(text: str, match) -> str:
    start = max(0, match.start() - 60)
    return ("..." if start else "") + text[start : match.end() + 60].strip()


def _exit_how(data, rank: int) -> str | None:
    beat = getattr(data.ranks.get(rank), "heartbeat", None)
    return getattr(getattr(beat, "exit", None), "how", None)


def _exit_error(data, rank: int) -> str | None:
    beat = getattr(data.ranks.get(rank), "heartbeat", None)
    return getattr(getattr(beat, "exit", None), "error", None)


def _raised_own_error(data, rank: int) -> bool:
    """The rank ended with an error of its own, or recorded one (its first): a restart into the same directory
    replaces the exit record of the attempt judged, and its recorded errors stay."""
    if _exit_how(data, rank) == "exception" and is_own_error(_exit_error(data, rank)):
        return True
    errors = getattr(data, "errors", None)
    if errors is None or not len(errors) or "rank" not in errors or "error" not in errors:
        return False
    own = errors[errors["rank"] == rank]
    if "time_us" in own:
        own = own.sort_values("time_us", kind="stable")
    return len(own) > 0 and is_own_error(str(own["error"].iloc[0]))


def _on(kind: str, why: str, data, ranks: list[int]) -> Action:
    hosts, gpus = [], []
    for rank in ranks:
        info = data.ranks.get(rank)
        host, gpu = getattr(info, "host", None), getattr(info, "gpu", None)
        if host and host not in hosts:
            hosts.append(host)
        if gpu and gpu not in gpus:
            gpus.append(gpu)
    return Action(kind, why, hosts[:MAX_NAMED], gpus[:MAX_NAMED])
