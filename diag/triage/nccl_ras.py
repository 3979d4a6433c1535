"""NCCL's RAS status output (``ncclras``, NCCL 2.24+), read as a second hang signal beside Flight Recorder and the
heartbeats. No torch.

RAS answers on port 28028 of every node with a summary of every NCCL communicator of the job: the ranks that
answered, each rank's count of collective operations launched (per operation type since 2.26), the ranks and
processes it could not reach (unresponsive; "dead" after 60 s) and the communicators whose ranks disagree
(MISMATCH). Two formats: text (every version; ``ncclras`` or ``echo verbose status | nc localhost 28028``) and
JSON (2.28.7+, ``ncclras -f json``). The text lists only the outliers of a disagreement (at most 10 ranks, under
25% of the communicator; under 50% with ``-v``), the JSON every rank. Printing code: NCCL's
``src/ras/client_support.cc``.

``parse`` never raises: what it cannot read becomes a note. ``findings`` turns the outputs of successive polls
into what triage uses: ranks dead or unreachable, ranks behind in a disagreement, and whether the counts moved
between the last polls (a mismatch is normal while collectives run; it is a hang only when it does not change).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

RAS_FILE_RE = re.compile(r"^nccl_ras.*\.(txt|json|log)$")  # a triage directory's RAS outputs, at its top level
MAX_RAS_BYTES = 64 << 20  # a RAS output of a 16k-rank job in JSON is a few MB
MIN_FROZEN_POLLS = 2  # successive outputs showing the same disagreement before it counts as a hang
MAX_LISTED = 16
MAX_RAS_FILES = 20  # the newest outputs of a directory read (monitor files sort after timestamped polls)


@dataclass
class RasRank:
    """One rank of a communicator as RAS reported it. The text format lists only outliers."""

    rank: int
    host: str | None = None
    pid: int | None = None
    gpu: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # operation type -> operations launched (JSON only)
    status: str | None = None  # INIT, RUNNING, FINALIZE, ABORT (JSON, or text where listed)
    error: str | None = None  # init or async error (JSON: its ncclResult_t code)


@dataclass
class RasMissingRank:
    """A rank of a communicator RAS got no data from."""

    rank: int
    host: str | None = None
    pid: int | None = None
    gpu: int | None = None
    unresponsive: bool | None = None  # RAS could not reach its process (None: the text does not say)
    dead: bool = False  # RAS gave up on its process (unreachable for 60 s)


@dataclass
class CountGroup:
    """Ranks of a communicator that launched the same number of operations of one type."""

    count: int
    n_ranks: int
    ranks: list[int] = field(default_factory=list)  # those listed (the text lists only outliers)


@dataclass
class RasMismatch:
    """Ranks of one communicator launched different numbers of one operation type (``op``: AllReduce, ...;
    "collective" before NCCL 2.26, which counted all types together)."""

    op: str
    groups: list[CountGroup] = field(default_factory=list)
    behind: list[int] | None = None  # ranks below the highest count (None: RAS did not list them)

    def key(self) -> tuple:
        return (self.op, tuple(sorted((g.count, g.n_ranks) for g in self.groups)))


@dataclass
class RasComm:
    comm_hash: str  # 16 hex digits, as NCCL's debug output prints it
    size: int | None = None  # ranks in the communicator
    ranks_per_node: str | None = None  # "8", or "7-8" where nodes differ (text)
    status: str | None = None  # the summary table's status (text)
    ranks: dict[int, RasRank] = field(default_factory=dict)
    missing: dict[int, RasMissingRank] = field(default_factory=dict)
    n_missing: int = 0  # as RAS counted them (the text may list fewer)
    mismatches: list[RasMismatch] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # init or async errors, as RAS words them


@dataclass
class RasProcess:
    pid: int
    host: str
    gpus: str


@dataclass
class RasReport:
    source: str
    format: str  # "text", "json", or "" when nothing could be read
    version: str | None = None  # NCCL's
    comms: list[RasComm] = field(default_factory=list)
    dead: list[RasProcess] = field(default_factory=list)  # job processes RAS considers dead
    unreachable: list[RasProcess] = field(default_factory=list)  # job processes that sent no data this time
    timeouts: int = 0
    notes: list[str] = field(default_factory=list)  # what could not be read
    summary: bool = False  # it holds a communicator summary (a status poll), not only monitor events

    @property
    def ok(self) -> bool:
        return bool(self.format)

    def comm(self, comm_hash: str) -> RasComm | None:
        return next((c for c in self.comms if c.comm_hash == comm_hash), None)


# -- reading -------------------------------------------------------------------------------------------------------


def read_file(path: Path) -> RasReport:
    """One saved RAS output; a file that cannot be read is a report with a note."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RAS_BYTES + 1)
    except OSError as exc:
        return RasReport(str(path), "", notes=[f"{path.name}: unreadable: {exc}"])
    if len(raw) > MAX_RAS_BYTES:
        return RasReport(str(path), "", notes=[f"{path.name}: over {MAX_RAS_BYTES >> 20} MiB, not read"])
    return parse(raw.decode("utf-8", "replace"), str(path))


def parse(text: str, source: str = "<ras>") -> RasReport:
    """A RAS output in either format. Never raises: what is not RAS output is a report with a note."""
    name = Path(source).name
    body = _strip_protocol(text)
    try:
        if body.lstrip().startswith("{"):
            return _parse_json(body, source)
        report = _parse_text(body, source)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        return RasReport(source, "", notes=[f"{name}: not a readable NCCL RAS output ({exc})"])
    if not report.format:
        report.notes.append(f"{name}: not NCCL RAS output (no communicator summary, no RAS errors)")
    return report


def _strip_protocol(text: str) -> str:
    """The replies a raw socket session adds before the status (``nc``: ``OK`` to ``set format json``)."""
    lines = text.splitlines(keepends=True)
    skip = 0
    while skip < len(lines) and re.match(r"^(OK|SERVER PROTOCOL \d+)\s*$", lines[skip]):
        skip += 1
    return "".join(lines[skip:])


# NCCL 2.28.7 and 2.28.9 print a missing rank's "nvml_dev" without the comma that must follow it
# (client_support.cc jsonWriteMissingRank): the output is not JSON exactly when some rank is missing.
_NVML_COMMA_RE = re.compile(r'("nvml_dev":\s*-?\d+)(\s*\n\s*"status")')


def _parse_json(text: str, source: str) -> RasReport:
    report = RasReport(source, "json", summary=True)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        repaired, fixes = _NVML_COMMA_RE.subn(r"\1,\2", text)
        try:
            data = json.loads(repaired)
        except json.JSONDecodeError as exc:
            return RasReport(source, "", notes=[f"{Path(source).name}: RAS JSON unreadable: {exc}"])
        if fixes:
            report.notes.append(
                f"{Path(source).name}: {fixes} missing comma(s) after nvml_dev repaired (NCCL 2.28.x JSON)"
            )
    if not isinstance(data, dict) or not isinstance(data.get("communicators"), list):
        return RasReport(source, "", notes=[f"{Path(source).name}: JSON without a communicators list: not RAS"])
    report.version = str(data.get("nccl_version")) if data.get("nccl_version") is not None else None
    report.timeouts = _int(_dict(data.get("ras")).get("timeouts_count")) or 0
    for raw in data["communicators"]:
        if isinstance(raw, dict) and _hash(raw.get("hash")) is not None:
            report.comms.append(_json_comm(raw))
    return report


def _json_rank_items(items) -> list[tuple[dict, tuple, dict]]:
    """The JSON entries of ranks (present or missing) that name a rank: (entry, (rank, host, pid, GPU), status)."""
    return [
        (
            item,
            (_int(item["rank"]), _host(item.get("host")), _pid(item.get("pid")), _int(item.get("cuda_dev"))),
            _dict(item.get("status")),
        )
        for item in items or []
        if isinstance(item, dict) and _int(item.get("rank")) is not None
    ]


def _json_comm(raw: dict) -> RasComm:
    comm = RasComm(_hash(raw.get("hash")), size=_int(raw.get("size")))
    for item, who, status in _json_rank_items(raw.get("ranks")):
        counts = {str(k): int(v) for k, v in _dict(item.get("collective_counts")).items() if _int(v) is not None}
        rank = RasRank(*who, counts, _json_status(status))
        init_state, async_error = _int(status.get("init_state")) or 0, _int(status.get("async_error")) or 0
        if init_state not in (0, 7) or async_error not in (0, 7):  # 7: ncclInProgress
            rank.error = f"init_state {init_state}, async_error {async_error}"
            comm.errors.append(f"rank {rank.rank}: {rank.error}")
        comm.ranks[rank.rank] = rank
    for _item, who, status in _json_rank_items(raw.get("missing_ranks")):
        unresponsive = bool(status.get("unresponsive")) if "unresponsive" in status else None
        missing = RasMissingRank(*who, unresponsive, bool(status.get("considered_dead")))
        comm.missing[missing.rank] = missing
    comm.n_missing = _int(raw.get("missing_ranks_count")) or len(comm.missing)
    comm.mismatches = _json_mismatches(comm)
    return comm


def _json_status(status: dict) -> str:
    """As the text format derives it (client_support.cc, "Communicator ranks have different status")."""
    if status.get("abort_flag"):
        return "ABORT"
    if status.get("finalize_called") or status.get("destroy_flag"):
        return "FINALIZE"
    return "RUNNING" if (_int(status.get("init_state")) or 0) == 0 else "INIT"


def _json_mismatches(comm: RasComm) -> list[RasMismatch]:
    ops = sorted({op for rank in comm.ranks.values() for op in rank.counts})
    mismatches = []
    for op in ops:
        by_count: dict[int, list[int]] = {}
        for rank in comm.ranks.values():
            by_count.setdefault(rank.counts.get(op, 0), []).append(rank.rank)
        if len(by_count) < 2:
            continue
        top = max(by_count)
        groups = [CountGroup(count, len(ranks), sorted(ranks)) for count, ranks in sorted(by_count.items())]
        behind = sorted(r for count, ranks in by_count.items() if count < top for r in ranks)
        mismatches.append(RasMismatch(op, groups, behind))
    return mismatches


_TABLE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
_COMM_HEAD = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]+)\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_PROCESS = re.compile(r"^\s+Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_PEER_DEAD = re.compile(r"PEER_DEAD: Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_RANK_WHERE = (
    r"(?: -- (?:GPU (\d+)(?: \(NVML \d+\))? managed by process (\d+) on node (\S+)|\[process information not found\]))"
)
_RANK_LINE = re.compile(rf"^\s+Rank (\d+){_RANK_WHERE}\s*$")
_RANK_COUNT = re.compile(
    rf"^\s+Rank (\d+) has (?:launched up to operation (\d+)|not launched any operations){_RANK_WHERE}?\s*$"
)
_RANK_STATUS = re.compile(rf"^\s+Rank (\d+) has status ([A-Z]+){_RANK_WHERE}?\s*$")
_GROUP_COUNT = re.compile(r"^\s+(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)\s*$")
_GROUP_STATUS = re.compile(r"^\s+(\d+) ranks have status ([A-Z]+)\s*$")
_DIFFERENT_COUNTS = re.compile(r"^\s+Communicator ranks have different (\w+) operation counts\s*$")
_MISSING_LIST = re.compile(r"^\s+The missing ranks?: ([\d,]+)\s*$")
_MISSING_N = re.compile(r"^\s+Missing communicator data from (\d+) ranks?\s*$")
_TIMEOUTS = re.compile(r"^\s+Encountered (\d+) communication timeouts?")


def _parse_text(text: str, source: str) -> RasReport:
    """Follows the printing code of client_support.cc (2.24 to 2.30): the summary table, then the Errors and
    Warnings sections, whose blocks are job-level (INCOMPLETE, DEAD, TIMEOUT) or per communicator (#g-c)."""
    report = RasReport(source, "")
    version = re.search(r"^NCCL version (\S+) compiled with CUDA", text, re.M)
    report.version = version.group(1) if version else None
    table: dict[int, tuple[int, str, str]] = {}  # group -> (ranks per comm, ranks per node, status)
    block: str | None = None  # the block being read: "INCOMPLETE", "DEAD", "comm"
    comm: RasComm | None = None
    mismatch: RasMismatch | None = None
    status_group: str | None = None
    recognised = False
    for line in text.splitlines():
        if line.startswith(("Group     Comms", "Communicators...", "No communicator data collected")):
            recognised, block, comm = True, None, None  # the summary table follows
            report.summary = True
            continue
        if line.startswith("RAS Monitor Mode"):
            recognised = True
            continue
        row = _TABLE_ROW.match(line)
        if row and block is None:
            table[int(row.group(1))] = (int(row.group(5)), row.group(4), row.group(7))
            continue
        dead = _PEER_DEAD.search(line)
        if dead:  # monitor mode (2.29+)
            report.dead.append(RasProcess(int(dead.group(1)), dead.group(2), dead.group(3)))
            recognised = True
            continue
        if not line.strip() or line.startswith("="):
            continue
        if not line.startswith(" "):  # a block's first line
            head = _COMM_HEAD.match(line)
            block, mismatch, status_group = line.strip(), None, None
            if head:
                recognised = report.summary = True
                comm = _text_comm(report, head.group(3), table.get(int(head.group(1))))
                block = head.group(4)
                if block == "MISMATCH":
                    block = "comm-mismatch"
                elif block == "INCOMPLETE":
                    block = "comm-incomplete"
                else:
                    block = "comm-error"
            elif block in ("INCOMPLETE", "DEAD", "TIMEOUT"):
                recognised = True
                comm = None
            else:
                comm = None
            continue
        _text_line(report, line, block, comm, mismatch, status_group)
        if block == "comm-mismatch" and comm is not None:
            different = _DIFFERENT_COUNTS.match(line)
            if different:
                mismatch = RasMismatch(different.group(1))
                comm.mismatches.append(mismatch)
                status_group = None
            elif "Communicator ranks have different status" in line:
                mismatch, status_group = None, ""
            elif mismatch is None and _GROUP_STATUS.match(line):
                status_group = _GROUP_STATUS.match(line).group(2)
            elif mismatch is not None:
                _count_line(comm, mismatch, line)
    for comm in report.comms:
        for mismatch in comm.mismatches:
            mismatch.behind = _text_behind(mismatch, comm)
    if recognised:
        report.format = "text"
    return report


def _text_comm(report: RasReport, comm_hash: str, row: tuple | None) -> RasComm:
    key = _hash(comm_hash)
    comm = report.comm(key)
    if comm is None:
        comm = RasComm(key)
        if row is not None:
            comm.size, comm.ranks_per_node, comm.status = row
        report.comms.append(comm)
    return comm


def _text_line(report, line, block, comm, mismatch, status_group) -> None:
    """A line of a job-level block, or the rank lines of a communicator's INCOMPLETE and status blocks."""
    process = _PROCESS.match(line)
    if process and block in ("INCOMPLETE", "DEAD"):
        found = RasProcess(int(process.group(1)), process.group(2), process.group(3))
        (report.dead if block == "DEAD" else report.unreachable).append(found)
        return
    timeouts = _TIMEOUTS.match(line)
    if timeouts and block == "TIMEOUT":
        report.timeouts = int(timeouts.group(1))
        return
    if comm is None:
        return
    if block == "comm-incomplete":
        count = _MISSING_N.match(line)
        if count:
            comm.n_missing = int(count.group(1))
        listed = _MISSING_LIST.match(line)
        if listed:
            for rank in listed.group(1).split(","):
                if rank.strip().isdigit():
                    comm.missing.setdefault(int(rank), RasMissingRank(int(rank)))
        rank = _RANK_LINE.match(line)
        if rank:  # 2.26+: a missing rank is listed only when its process did not answer at all
            gpu, pid, host = rank.group(2), rank.group(3), rank.group(4)
            comm.missing[int(rank.group(1))] = RasMissingRank(
                int(rank.group(1)), host, int(pid) if pid else None, int(gpu) if gpu else None, True
            )
    elif block == "comm-error":
        comm.errors.append(line.strip())
    elif block == "comm-mismatch" and mismatch is None and status_group is not None:
        listed = _RANK_STATUS.match(line) or _RANK_LINE.match(line)
        if listed:
            rank = _listed_rank(comm, listed, 3 if listed.re is _RANK_STATUS else 2)
            rank.status = listed.group(2) if listed.re is _RANK_STATUS else status_group


def _listed_rank(comm: RasComm, match, first: int) -> RasRank:
    number = int(match.group(1))
    rank = comm.ranks.setdefault(number, RasRank(number))
    gpu, pid, host = match.group(first), match.group(first + 1), match.group(first + 2)
    rank.gpu = int(gpu) if gpu else rank.gpu
    rank.pid = int(pid) if pid else rank.pid
    rank.host = host or rank.host
    return rank


def _count_line(comm: RasComm, mismatch: RasMismatch, line: str) -> None:
    group = _GROUP_COUNT.match(line)
    if group:
        mismatch.groups.append(CountGroup(int(group.group(2) or 0), int(group.group(1))))
        return
    single = _RANK_COUNT.match(line)
    if single:  # a group of one: printed as one line
        mismatch.groups.append(CountGroup(int(single.group(2) or 0), 1, [int(single.group(1))]))
        _listed_rank(comm, single, 3)
        return
    listed = _RANK_LINE.match(line)
    if listed and mismatch.groups:  # a member of the group printed just above it
        mismatch.groups[-1].ranks.append(int(listed.group(1)))
        _listed_rank(comm, listed, 2)


def _text_behind(mismatch: RasMismatch, comm: RasComm) -> list[int] | None:
    """The ranks below the highest count. The text lists only outlier groups: when exactly one group is not
    listed and the communicator's size is known, its ranks are the others (those that answered)."""
    if not mismatch.groups:
        return None
    top = max(g.count for g in mismatch.groups)
    unlisted = [g for g in mismatch.groups if len(g.ranks) < g.n_ranks]
    if len(unlisted) == 1 and comm.size:
        listed = {r for g in mismatch.groups for r in g.ranks}
        rest = sorted(set(range(comm.size)) - listed - set(comm.missing))
        if len(rest) == unlisted[0].n_ranks:
            unlisted[0].ranks = rest
            unlisted = []
    if any(g.count < top for g in unlisted):
        return None
    return sorted(r for g in mismatch.groups if g.count < top for r in g.ranks)


# -- successive polls ---------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """Whether the operation counts of the communicators in disagreement moved across successive polls."""

    polls: int  # outputs compared
    frozen: dict[str, RasMismatch] = field(default_factory=dict)  # comm hash -> a disagreement unchanged
    moving: list[str] = field(default_factory=list)  # comm hashes whose disagreement changed or cleared


def progress(reports: list[RasReport], min_polls: int = MIN_FROZEN_POLLS) -> Progress:
    """Across the last ``min_polls`` status polls (oldest first; monitor-only outputs are no polls): the
    communicators whose disagreement is the same in each (same counts: no rank launched anything) and those
    whose counts moved or whose disagreement cleared. With fewer polls than that nothing is called frozen."""
    polls = [r for r in reports if r.ok and r.summary]
    result = Progress(len(polls))
    if len(polls) < min_polls:
        return result
    window = polls[-min_polls:]
    for comm in window[-1].comms:
        if not comm.mismatches:
            continue
        earlier = [report.comm(comm.comm_hash) for report in window[:-1]]
        if all(e is not None and e.mismatches and _state(e) == _state(comm) for e in earlier):
            result.frozen[comm.comm_hash] = comm.mismatches[0]
        else:
            result.moving.append(comm.comm_hash)
    return result


def _state(comm: RasComm) -> tuple:
    """What must stay unchanged for a communicator to count as stuck: every rank's counts where known
    (JSON), else the disagreements as printed (text)."""
    if any(rank.counts for rank in comm.ranks.values()):
        return tuple(sorted((r.rank, tuple(sorted(r.counts.items()))) for r in comm.ranks.values()))
    return tuple(sorted(m.key() for m in comm.mismatches))


# -- what triage takes from them -------------------------------------------------------------------------------------


@dataclass
class RasFindings:
    """RAS evidence in global ranks, for triage."""

    files: list[str] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)  # global rank -> why RAS counts it dead
    unresponsive: dict[int, str] = field(default_factory=dict)  # global rank -> RAS could not reach it
    behind: list[int] = field(default_factory=list)  # global ranks behind in a disagreement unchanged across polls
    frozen: bool = False  # some disagreement did not move across MIN_FROZEN_POLLS polls
    hang_lines: list[str] = field(default_factory=list)  # evidence of the frozen disagreement
    lines: list[str] = field(default_factory=list)  # evidence lines for every verdict


def findings(reports: list[RasReport], world_size: int, pids: dict[int, tuple[int | None, str | None]]) -> RasFindings:
    """``reports``: the outputs of successive polls, oldest first. A communicator's ranks are global ranks when
    it spans the world (torch's default group: its NCCL ranks are the global ones); otherwise a rank is
    matched by its process id (``pids``: global rank -> (pid, host) from the trace's manifests), and left as
    communicator-level evidence when neither holds: RAS knows communicator hashes, not process group names."""
    out = RasFindings(files=[Path(r.source).name for r in reports])
    for report in reports:
        out.lines += [f"NCCL RAS: {note}" for note in report.notes]
    polls = [r for r in reports if r.ok and r.summary]
    dead_processes = {(p.pid, p.host): p for r in reports if r.ok for p in r.dead}  # dead stays dead
    latest = polls[-1] if polls else RasReport("", "")
    name = Path(latest.source).name if polls else ", ".join(out.files)
    by_pid: dict[int, list[int]] = {}
    for rank, (pid, _host) in pids.items():
        if pid is not None:
            by_pid.setdefault(pid, []).append(rank)

    def global_rank(comm: RasComm, rank: int, pid: int | None, host: str | None) -> int | None:
        if comm.size is not None and comm.size == world_size and 0 <= rank < world_size:
            return rank
        matches = by_pid.get(pid, []) if pid is not None else []
        if len(matches) > 1 and host:
            matches = [r for r in matches if pids[r][1] == host]
        return matches[0] if len(matches) == 1 else None

    for process in dead_processes.values():
        rank = _process_rank(by_pid, pids, process)
        if rank is not None:
            out.dead[rank] = f"its process {process.pid} on {process.host} considered dead by NCCL RAS ({name})"
    for process in latest.unreachable:
        rank = _process_rank(by_pid, pids, process)
        if rank is not None:
            out.unresponsive[rank] = f"its process {process.pid} on {process.host} sent NCCL RAS no data ({name})"
    for comm in latest.comms:
        unmapped = []
        for missing in comm.missing.values():
            dead = missing.dead or (missing.pid, missing.host) in dead_processes
            where = _where(missing.pid, missing.host, missing.gpu)
            rank = global_rank(comm, missing.rank, missing.pid, missing.host)
            what = "considered dead" if dead else "unresponsive" if missing.unresponsive else "sent no data"
            text = f"{what} by NCCL RAS ({name}): communicator {comm.comm_hash} rank {missing.rank}{where}"
            if rank is None:
                unmapped.append(f"rank {missing.rank}{where} {what}")
            elif dead:
                out.dead[rank] = text
            else:
                out.unresponsive.setdefault(rank, text)
        missing_text = f"; {len(comm.missing)} missing" if comm.missing else ""
        if comm.n_missing > len(comm.missing):
            missing_text = f"; {comm.n_missing} missing ({len(comm.missing)} listed)"
        if comm.missing or comm.n_missing:
            mapped = sorted(
                r for m in comm.missing.values() if (r := global_rank(comm, m.rank, m.pid, m.host)) is not None
            )
            out.lines.append(
                f"NCCL RAS ({name}): communicator {comm.comm_hash} ({comm.size or '?'} ranks{missing_text}): "
                + (f"global {_ranks(mapped)} sent no data" if mapped else "")
                + ("; " if mapped and unmapped else "")
                + (f"not mapped to global ranks: {'; '.join(unmapped[:MAX_LISTED])}" if unmapped else "")
            )
        for error in comm.errors[:MAX_LISTED]:
            out.lines.append(f"NCCL RAS ({name}): communicator {comm.comm_hash}: {error}")
    for process in dead_processes.values():
        out.lines.append(
            f"NCCL RAS ({name}): process {process.pid} on node {process.host} (GPU {process.gpus}) considered dead"
        )
    for process in latest.unreachable:
        out.lines.append(
            f"NCCL RAS ({name}): process {process.pid} on node {process.host} (GPU {process.gpus}) sent no data"
        )
    moved = progress(polls)
    for comm in latest.comms:
        for mismatch in comm.mismatches:
            behind = [global_rank(comm, r, *_pid_host(comm, r)) for r in (mismatch.behind or [])]
            counts = ", ".join(f"{g.n_ranks} at {g.count}" for g in sorted(mismatch.groups, key=lambda g: g.count))
            if mismatch.behind:
                who = (
                    f"global {_ranks([r for r in behind if r is not None])} behind"
                    if None not in behind
                    else f"communicator {_ranks(mismatch.behind)} behind (not mapped to global ranks)"
                )
            else:
                who = "the ranks behind not listed (ncclras -v lists more)"
            if comm.comm_hash in moved.frozen and mismatch is moved.frozen[comm.comm_hash]:
                state = f"unchanged across the last {min(moved.polls, MIN_FROZEN_POLLS)} polls: stuck"
                out.frozen = True
                out.behind += [r for r in behind if r is not None]
                out.hang_lines.append(
                    f"NCCL RAS ({name}): communicator {comm.comm_hash}: {mismatch.op} operation counts differ "
                    f"({counts}), {who}; {state}"
                )
                continue
            if comm.comm_hash in moved.moving:
                state = "counts moving between polls: not a hang"
            else:
                state = f"one poll: a hang only if unchanged across {MIN_FROZEN_POLLS} polls"
            out.lines.append(
                f"NCCL RAS ({name}): communicator {comm.comm_hash}: {mismatch.op} operation counts differ "
                f"({counts}), {who}; {state}"
            )
    out.behind = sorted(set(out.behind))
    return out


def _process_rank(by_pid: dict, pids: dict, process: RasProcess) -> int | None:
    """The global rank whose manifest names this process (pid, and host where pids repeat across hosts)."""
    matches = by_pid.get(process.pid, [])
    if len(matches) > 1:
        matches = [r for r in matches if pids[r][1] == process.host]
    return matches[0] if len(matches) == 1 else None


def _pid_host(comm: RasComm, rank: int) -> tuple[int | None, str | None]:
    known = comm.ranks.get(rank)
    return (known.pid, known.host) if known is not None else (None, None)


def _where(pid: int | None, host: str | None, gpu: int | None) -> str:
    if pid is None and host is None:
        return ""
    gpu_text = f", GPU {gpu}" if gpu is not None else ""
    return f" (process {pid if pid is not None else '?'} on {host or '?'}{gpu_text})"


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {_list(ranks)}"


def _list(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:MAX_LISTED]))
    return shown + (f" and {len(ranks) - MAX_LISTED} more" if len(ranks) > MAX_LISTED else "")


def is_ras_file(name: str) -> bool:
    return bool(RAS_FILE_RE.match(name))


def _hash(value) -> str | None:
    """A communicator hash as the text prints it (16 hex digits); the JSON prints it without leading zeros."""
    try:
        return f"{int(str(value), 16):016x}"
    except (TypeError, ValueError):
        return None


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _pid(value) -> int | None:
    pid = _int(value)
    return pid if pid is not None and pid >= 0 else None  # -1: RAS did not know the process


def _host(value) -> str | None:
    return None if value in (None, "", "unknown") else str(value)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}
