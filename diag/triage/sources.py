"""Turn either input of ``diag triage`` into the same two things: one table of collectives (one row per rank
and (pg, seq), with whether it completed) and what is known of each rank (heartbeat, exit, step, stack).

A diag trace directory gives collectives.csv (a row with no duration never completed), the pending
collectives and stacks of the watchdog's hang dumps, heartbeats and manifests; a Flight Recorder dump in a
rank directory fills in what diag's own records lack. A directory of Flight Recorder dumps gives only the
dumps. No torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from diag.processes import worker_count
from diag.trace.loader import (
    RankRead,
    Skipped,
    TraceError,
    TraceReader,
    _listing,
    assemble_trace,
    empty_table,
    find_rank_dirs,
    gather_rank_reads,
    load_json_limited,
    read_file_bytes,
    to_frame,
)
from diag.trace.manifest import CaptureStopped, Manifest
from diag.trace.mesh import MeshLayout, dimension_of
from diag.trace.records import HangDump, Heartbeat
from diag.trace.schema import (
    FATAL_STACKS_FILE,
    FR_DUMP_FILE,
    MAX_RANK,
    SCALAR_TYPES,
    TABLES,
    earlier_heartbeat_number,
    hang_dump_number,
)
from diag.triage import debug_server, fr_checks, nccl_ras
from diag.triage.flight_recorder import DumpRejected, FRDump, load_dump, sizes_text
from diag.triage.summary import heartbeat_ops, judged_by_heartbeat
from diag.triage.tail import read_tail

P2P_OPS = ("send", "recv")  # numbered per rank by a counter of their own, not per group
OPS_COLUMNS = [
    "rank",
    "pg",
    "seq",
    "op",
    "bytes",
    "dtype",
    "sizes",
    "completed",
    "start_us",
    "step",
    "call_site",
    "source",
    "shape",  # input and output shapes where Flight Recorder recorded them ("" where unknown)
]
MAX_DUMPS_READ = 20  # the newest hang dumps read per rank (each holds every thread's stack)
ERROR_COLUMNS = ["rank", "time_us", "kind", "step", "pg", "seq", "op", "start_us", "error"]
ERROR_KINDS = ("step_error", "oom")  # and every event kind ending in "_error" (collective_error)


@dataclass
class RankInfo:
    """What is known of one rank besides its collectives."""

    rank: int
    heartbeat: Heartbeat | None = None  # heartbeat.json as last written
    finished: bool = False  # diag.finish ran
    host: str | None = None
    gpu: str | None = None  # its GPU's UUID, else host:index, for an action naming it; None on CPU
    pid: int | None = None
    stall_dump: HangDump | None = None  # the watchdog's latest dump written because of a stall or a signal
    stalls: list[str] = field(default_factory=list)  # reasons of its dumps written for a stall (not a signal)
    first_stall_us: float | None = None  # when its earliest stall dump read was written
    last_stall: HangDump | None = None  # the latest dump written for a stall
    last_dump: HangDump | None = None  # the latest dump of any kind
    dumps: int = 0
    fatal_stacks: str | None = None  # faulthandler's output on a fatal signal
    fr_last: dict | None = None  # last Flight Recorder entry of the rank, for FR-only input
    has_data: bool = True
    backend: str | None = None  # the default group's backend (nccl, gloo), from the manifest or a dump
    capture_stopped: CaptureStopped | None = None  # a write failed mid-run: nothing recorded after its step
    judged_by_heartbeat: bool = False  # its tables were not read: its heartbeat said enough (summary.py)
    ras: str | None = None  # what NCCL RAS says of it: dead or unreachable (nccl_ras.py)
    ras_dead: bool = False  # NCCL RAS considers its process dead
    # the attempt before the latest in this directory (a restarted job): its last heartbeat (kept by the
    # restart) and the dumps it wrote, as a RankInfo of their own; None when the rank ran once
    earlier: RankInfo | None = None


@dataclass
class TriageInput:
    path: Path
    kind: str  # "diag" or "flight_recorder"
    world_size: int
    ops: pd.DataFrame  # OPS_COLUMNS
    ranks: dict[int, RankInfo]
    pg_ranks: dict[str, list[int]]  # process group -> member ranks (global)
    skipped: list[Skipped] = field(default_factory=list)
    steps: pd.DataFrame | None = None  # diag only: rank, step, duration_us, comm_wait_us
    notes: list[str] = field(default_factory=list)
    completion_reliable: bool = True  # False for gloo Flight Recorder dumps: a failed op reads as completed
    nccl_logs: dict = field(default_factory=dict)  # diag only: rank -> NcclLog, from the ranks' nccl.log
    # diag only: reads the steps of the ranks judged from their heartbeats (whose tables were not read)
    more_steps: Callable[[], pd.DataFrame | None] | None = None
    # diag only: reads the collectives of those ranks (OPS_COLUMNS), whose heartbeats hold only each group's last
    more_ops: Callable[[], pd.DataFrame | None] | None = None
    # Flight Recorder only: what the entries themselves show (send/recv pairs, all_to_all splits)
    fr_problems: list[fr_checks.FRProblem] = field(default_factory=list)
    # diag only: the errors capture recorded (ERROR_COLUMNS), earliest first, whether or not the job caught them
    errors: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=ERROR_COLUMNS))
    attempt_start_us: dict[int, float] = field(default_factory=dict)  # rank -> when its latest diag.init ran
    # diag only: (rank, time_us) -> the phase the rank was in then, from its phases table (read when asked: a
    # rank that arrived late with no stall dump is placed by it)
    phase_at: Callable[[int, float], str | None] | None = None
    nccl_ras: nccl_ras.RasFindings | None = None  # saved NCCL RAS outputs in the directory (nccl_ras_*.json)
    mesh: MeshLayout | None = None  # the device mesh the process groups are slices of, on a run with one
    _ops_history: pd.DataFrame | None = field(default=None, repr=False)  # ops_history's, once read

    def all_steps(self) -> pd.DataFrame | None:
        """Every rank's steps read (``steps`` holds only those of the ranks whose tables were read)."""
        if self.more_steps is not None:
            extra, self.more_steps = self.more_steps(), None
            if extra is not None and len(extra):
                self.steps = extra if self.steps is None else pd.concat([self.steps, extra], ignore_index=True)
        return self.steps

    def ops_history(self) -> pd.DataFrame:
        """``ops`` with the earlier collectives of the ranks judged from their heartbeats (their rows read once,
        when asked): where ranks fell out of step is in the history, which a heartbeat does not carry."""
        if self.more_ops is not None:
            extra, self.more_ops = self.more_ops(), None
            if extra is not None and len(extra):
                self._ops_history = pd.concat([self.ops, extra], ignore_index=True)
        return self.ops if self._ops_history is None else self._ops_history


def read_input(path: str | Path, progress: bool = False, workers: int | None = None) -> TriageInput:
    """Read a diag trace directory or a directory of Flight Recorder dumps. Raises TraceError when neither.
    ``progress``: a bar on stderr while a large trace's ranks are read. ``workers``: processes reading a diag
    trace's ranks (1: this process; None: ``diag.processes.worker_count`` decides)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path} does not exist")
    if path.is_dir() and find_rank_dirs(path):
        return with_nccl_ras(read_diag_trace(path, progress=progress, workers=workers))
    if debug_server.is_dump_dir(path):
        return with_nccl_ras(debug_server.read_debug_server_dir(path))
    return with_nccl_ras(read_fr_dir(path))


def with_nccl_ras(data: TriageInput) -> TriageInput:
    """``data`` with what the NCCL RAS outputs saved at the directory's top level (``nccl_ras*.txt`` or
    ``.json``, oldest first by name) say: ranks RAS counts dead or could not reach, ranks behind in a
    disagreement of operation counts, as evidence lines; a file that cannot be read is a note."""
    directory = data.path if data.path.is_dir() else data.path.parent
    try:
        files = sorted(p for p in directory.iterdir() if nccl_ras.is_ras_file(p.name) and p.is_file())
    except OSError:
        return data
    if not files:
        return data
    if len(files) > nccl_ras.MAX_RAS_FILES:  # a watch saving a poll every 30 s: the newest tell the state
        data.notes.append(f"NCCL RAS: the newest {nccl_ras.MAX_RAS_FILES} of {len(files)} outputs read")
        files = files[-nccl_ras.MAX_RAS_FILES :]
    pids = {rank: (info.pid, info.host) for rank, info in data.ranks.items()}
    found = nccl_ras.findings([nccl_ras.read_file(p) for p in files], data.world_size, pids)
    for rank, text in [*found.unresponsive.items(), *found.dead.items()]:
        info = data.ranks.get(rank)
        if info is not None:
            info.ras, info.ras_dead = text, rank in found.dead
    data.notes += found.lines + found.hang_lines
    data.nccl_ras = found
    return data


# -- diag trace directories -------------------------------------------------------------------------------------


TRIAGE_TABLES = ("steps", "collectives")  # telemetry, memory and phases are not needed: not parsed
# A hang is decided by each rank's last collectives: of a large trace only each rank's last rows of the steps and
# collectives are read, TAIL_ROWS_BUDGET rows in all (at least TAIL_ROWS_MIN a rank). Traces of up to
# TAIL_ROWS_BUDGET / TAIL_ROWS_MIN ranks with fewer rows than that a rank are read whole, as diag.load reads them.
TAIL_ROWS_BUDGET = 1_000_000
TAIL_ROWS_MIN = 64


def tail_rows(ranks: int) -> int:
    """How many of its last rows of each table triage reads per rank, in a trace of ``ranks`` ranks."""
    return max(TAIL_ROWS_MIN, TAIL_ROWS_BUDGET // max(1, ranks))


def read_diag_trace(
    path: Path,
    rows_per_rank: int | None = None,
    heartbeats: bool = True,
    progress: bool = False,
    workers: int | None = None,
) -> TriageInput:
    """``rows_per_rank``: the last rows of each rank's steps and collectives read (``tail_rows`` by default).
    ``heartbeats``: judge the ranks whose heartbeat says enough from it, without reading their tables
    (diag/triage/summary.py); False: read every rank's tables. ``progress``: a bar while the ranks are read.
    ``workers``: processes reading the ranks (1: this process; default: ``diag.processes.worker_count``'s)."""
    reader = TraceReader(path, tables=())  # side files only: the tables are read from their ends below
    rank_dirs = reader.rank_dirs()
    rows = rows_per_rank or tail_rows(len(rank_dirs))
    data, infos, beats, cut = _read_tails(reader, rank_dirs, rows, heartbeats, progress, workers)
    judged = {rank for rank, info in infos.items() if info.judged_by_heartbeat}
    trace = assemble_trace(path, data, latest_run_only=False)  # _split_attempts judges each attempt
    ranks = {}
    with_rows = {int(r) for name in TRIAGE_TABLES for r in pd.unique(getattr(trace, name)["rank"])}
    for rank, info in infos.items():
        info.heartbeat = beats.get(rank)
        # a directory nothing could be read from (unreadable to this user): no more known than a missing one
        read_something = trace.manifest(rank) or info.heartbeat or info.dumps or rank in with_rows
        info.has_data = info.has_data and bool(read_something)
        manifest = trace.manifest(rank) or Manifest(rank)
        info.finished = manifest.finished
        info.host, info.pid, info.backend = manifest.host, manifest.pid, manifest.backend
        info.gpu = _gpu_name(manifest)
        info.capture_stopped = manifest.capture_stopped
        ranks[rank] = info
    skipped = list(trace.skipped)
    ops = _diag_ops(trace.collectives)
    ops = _with_heartbeat_ops(ops, {rank: beats[rank] for rank in sorted(judged)})
    ops = _add_pending_from_dumps(ops, ranks, _attempt_starts(trace.manifests))
    ops = _with_fr_dumps(ops, rank_dirs, skipped, _pg_ranks_from_manifests(trace, trace.world_size or 0))
    world_size = trace.world_size or (max(ranks) + 1 if ranks else 0)
    for rank in trace.ranks_missing:
        ranks[rank] = RankInfo(rank, has_data=False)
    steps = trace.steps[["rank", "step", "duration_us", "comm_wait_us", "data_wait_us"]] if len(trace.steps) else None
    notes = []
    if cut:
        notes.append(
            f"{cut} of {len(rank_dirs)} ranks have more records than triage reads: only the last {rows} steps and "
            "collectives of each rank were read (a desync or step divergence before those is not seen; the "
            "slowest rank is judged on those steps)"
        )
    if judged:
        others = "the others' tables were read" if len(judged) < len(rank_dirs) else "no rank's tables were read"
        notes.append(
            f"{len(judged)} of {len(rank_dirs)} ranks judged from their heartbeats (each group's last collective "
            f"issued and completed, and those pending) without reading their tables; {others}"
        )

    def more_steps() -> pd.DataFrame | None:  # the slow-rank verdict compares every rank's steps: read when asked
        return _steps_of(reader, {rank: rank_dirs[rank] for rank in sorted(judged)}, rows)

    def more_ops() -> pd.DataFrame | None:  # where ranks fell out of step: read when a verdict asks
        return _ops_of(reader, {rank: rank_dirs[rank] for rank in sorted(judged)}, rows)

    def phase_at(rank: int, time_us: float) -> str | None:
        return _phase_at(reader, rank_dirs.get(rank), rows, time_us)

    return TriageInput(
        path,
        "diag",
        world_size,
        ops,
        ranks,
        _pg_ranks_from_manifests(trace, world_size),
        skipped,
        steps,
        notes=notes,
        nccl_logs=trace.nccl_logs,
        more_steps=more_steps if judged else None,
        more_ops=more_ops if judged else None,
        errors=recorded_errors(trace.events),
        phase_at=phase_at,
        mesh=MeshLayout.from_manifests(trace.manifests),
        attempt_start_us=_attempt_starts(trace.manifests),
    )


def input_from_trace(trace) -> TriageInput:
    """What triage reads of a trace directory, from a ``Trace`` already loaded (``diag analyze``'s): its
    collectives (each rank's last ``tail_rows``, as triage reads them), recorded errors, heartbeats and
    manifests, and the side files the loader does not read (hang dumps, Flight Recorder dumps, NCCL RAS outputs)
    from the trace's directory where it has one: the collective a rank hung in is often known only from its hang
    dump. So ``diag analyze`` names the culprit ``diag triage`` names."""
    rows = tail_rows(max(1, len(trace.ranks_found)))
    rank_dirs = find_rank_dirs(trace.path) if trace.path is not None and Path(trace.path).is_dir() else {}
    collectives = trace.collectives
    if len(collectives):
        collectives = collectives.groupby("rank", sort=False).tail(rows)
    beats = {}
    if len(trace.heartbeats) and "rank" in trace.heartbeats:
        for raw in trace.heartbeats.to_dict("records"):
            beats[int(raw["rank"])] = Heartbeat.from_json({k: v for k, v in raw.items() if _present(v)})
    ranks = {}
    for rank in trace.ranks_found:
        manifest = trace.manifest(rank) or Manifest(rank)
        rank_dir = rank_dirs.get(rank)
        listing = _listing(rank_dir, []) if rank_dir is not None else []
        info = _dump_info(rank, rank_dir, listing, manifest.start_time_us) if rank_dir is not None else RankInfo(rank)
        info.heartbeat, info.finished, info.host = beats.get(rank), manifest.finished, manifest.host
        info.pid, info.backend, info.capture_stopped = manifest.pid, manifest.backend, manifest.capture_stopped
        info.gpu = _gpu_name(manifest)
        ranks[rank] = info
    for rank in trace.ranks_missing:
        ranks[rank] = RankInfo(rank, has_data=False)
    world_size = trace.world_size or (max(ranks) + 1 if ranks else 0)
    steps = trace.steps[["rank", "step", "duration_us", "comm_wait_us", "data_wait_us"]] if len(trace.steps) else None
    skipped = list(trace.skipped)
    found = {rank: rank_dirs[rank] for rank in trace.ranks_found if rank in rank_dirs}
    trace_groups = _pg_ranks_from_manifests(trace, world_size)
    ops = _add_pending_from_dumps(_diag_ops(collectives), ranks, _attempt_starts(trace.manifests))
    ops = _with_fr_dumps(ops, found, skipped, trace_groups)
    data = TriageInput(
        Path(trace.path) if trace.path is not None else None,
        "diag",
        world_size,
        ops,
        ranks,
        trace_groups,
        skipped,
        steps,
        errors=recorded_errors(trace.events),
        mesh=MeshLayout.from_manifests(trace.manifests),
        attempt_start_us=_attempt_starts(trace.manifests),
    )
    return with_nccl_ras(data) if rank_dirs else data


def _attempt_starts(manifests: dict[int, Manifest]) -> dict[int, float]:
    """rank -> when its latest diag.init ran (its manifest's start)."""
    return {rank: float(m.start_time_us) for rank, m in manifests.items() if m.start_time_us is not None}


def _present(value) -> bool:
    """A heartbeat field this rank wrote (a frame of every rank's heartbeats holds NaN for the others' keys)."""
    return not (value is None or (isinstance(value, float) and value != value))


def _with_fr_dumps(
    ops: pd.DataFrame, rank_dirs: dict[int, Path], skipped: list[Skipped], trace_groups: dict[str, list[int]]
) -> pd.DataFrame:
    """``ops`` with what the ranks' Flight Recorder dumps (``fr_dump.pkl``, written by the watchdog) add, their
    groups under the trace's names (``trace_groups``: the trace's group names and members)."""
    fr_ops = []
    for rank, rank_dir in rank_dirs.items():
        fr_path = rank_dir / FR_DUMP_FILE
        try:
            fr_path.stat()  # not exists(): in a directory at mode 000 that raises PermissionError
        except FileNotFoundError:
            continue
        except OSError as exc:
            skipped.append(Skipped(str(fr_path), f"unreadable: {exc}"))
            continue
        try:
            dump = load_dump(fr_path, rank)
            fr_ops.append(fr_ops_frame(trace_group_names(dump, trace_groups, ops[ops["rank"] == rank])))
        except DumpRejected as exc:
            skipped.append(Skipped(str(fr_path), str(exc)))
    return _merge_fr(ops, fr_ops)


def trace_group_names(dump: FRDump, trace_groups: dict[str, list[int]], rank_ops: pd.DataFrame) -> FRDump:
    """The dump with its groups under the trace's names. After ``destroy_process_group()`` and a new
    ``init_process_group``, torch names the new groups "0", "1" ... again, and Flight Recorder with it, while
    diag's trace calls them "0@1", "1@1" (``Session.trace_group_name``). The dump tells them apart by ``pg_id``,
    counted in creation order: a name's ids, oldest first, are that name's generations in the trace, oldest
    first (those whose members include this rank). Where the ring kept fewer generations than the trace has,
    the alignment is the one that puts most of the entries on a row diag wrote for the same group and seq
    (``rank_ops``: this rank's rows), the newest generations on a tie."""
    uids: dict[str, list[int]] = {}
    for entry in dump.entries:
        if entry.pg_uid is not None and entry.pg_uid not in uids.setdefault(entry.pg, []):
            uids[entry.pg].append(entry.pg_uid)
    renames: dict[tuple[str, int], str] = {}
    for name, ids in uids.items():
        generations = _generations(name, trace_groups, dump.rank)
        if len(generations) < 2 or len(ids) > len(generations):
            continue  # never made again, or a dump the trace does not describe: torch's name is the trace's
        ids = sorted(ids)
        seqs = {uid: {e.seq for e in dump.entries if e.pg_uid == uid and not e.is_p2p} for uid in ids}
        diag_seqs = {g: set(rank_ops.loc[rank_ops["pg"] == g, "seq"].astype("int64")) for g in generations}

        def matches(offset: int, ids=ids, seqs=seqs, diag_seqs=diag_seqs, generations=generations) -> int:
            return sum(len(seqs[uid] & diag_seqs[generations[i + offset]]) for i, uid in enumerate(ids))

        offset = max(range(len(generations) - len(ids) + 1), key=lambda k: (matches(k), k))
        renames.update({(name, uid): generations[i + offset] for i, uid in enumerate(ids)})
    if not renames:
        return dump
    entries = [dataclasses.replace(e, pg=renames.get((e.pg, e.pg_uid), e.pg)) for e in dump.entries]
    return dataclasses.replace(dump, entries=entries)


def _generations(name: str, trace_groups: dict[str, list[int]], rank: int) -> list[str]:
    """The trace's names of torch's group ``name``, oldest first: "0", "0@1", "0@2" ... (those ``rank`` is in)."""
    found = []
    for trace_name, members in trace_groups.items():
        base, _, generation = trace_name.partition("@")
        if base == name and (generation == "" or generation.isdigit()) and (not members or rank in members):
            found.append((int(generation or 0), trace_name))
    return [trace_name for _, trace_name in sorted(found)]


def _phase_at(reader: TraceReader, rank_dir: Path | None, rows: int, time_us: float) -> str | None:
    """The innermost phase a rank was in at ``time_us`` (a phase's row is written when it ends), from the last
    ``rows`` rows of its phases table; None when no phase row covers that time."""
    if rank_dir is None:
        return None
    tail = read_tail(reader, rank_dir, _listing(rank_dir, []), TABLES["phases"], rows, [])
    if tail.arrow is None or not tail.arrow.num_rows:
        return None
    phases = tail.arrow.to_pandas()
    start = phases["start_us"].astype("float64")
    covering = phases[(start <= time_us) & (time_us < start + phases["duration_us"].astype("float64"))]
    if covering.empty:
        return None
    return str(covering.sort_values("start_us")["name"].iloc[-1])


def recorded_errors(events: pd.DataFrame) -> pd.DataFrame:
    """The errors in the ranks' events (a collective that raised, an exception out of a step, an OOM), earliest
    first: an error the job caught leaves no exit record, only these."""
    if events is None or events.empty or "kind" not in events:
        return pd.DataFrame(columns=ERROR_COLUMNS)
    kind = events["kind"].astype(str)
    frame = events[kind.isin(ERROR_KINDS) | kind.str.endswith("_error")]
    frame = frame.reindex(columns=ERROR_COLUMNS)
    if "message" in events:  # an OOM's text
        frame["error"] = frame["error"].fillna(events.loc[frame.index, "message"])
    # every error has text, which the verdicts search: none recorded, or one the loader dropped (a list)
    texts = frame["error"].map(lambda value: value if isinstance(value, str) else None)
    frame["error"] = texts.fillna(frame["kind"].astype(str) + " (no message recorded)")
    for column in ("rank", "time_us", "start_us", "step", "seq"):  # a damaged event's field reads as unknown
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    frame = frame[frame["rank"].notna()].astype({"rank": "int64"})
    frame["pg"] = frame["pg"].where(frame["pg"].isna(), frame["pg"].astype(str))
    return frame.sort_values(["time_us", "rank"], kind="stable").reset_index(drop=True)


def _read_tails(
    reader: TraceReader,
    rank_dirs: dict[int, Path],
    rows: int,
    use_heartbeats: bool,
    progress: bool = False,
    workers: int | None = None,
) -> tuple[dict, dict[int, RankInfo], dict[int, Heartbeat | None], int]:
    """What ``TraceReader.poll`` gives (``assemble_trace``'s input), with only the last ``rows`` rows of the steps
    and collectives of each rank, and none of the ranks judged from their heartbeats (``use_heartbeats``); each
    rank's hang dumps and heartbeat; how many ranks had more rows than read. Read by ``TailRead`` on the engine's
    runner: in this process, or in ``diag.processes.worker_count`` worker processes for a large trace.
    ``progress``: a bar of the ranks read (worker processes only: a smaller read takes a few seconds)."""
    from diag.analysis.engine import RankSource, run_two_stage

    workers = worker_count(len(rank_dirs), workers)
    sources = [RankSource(str(reader.path), rank, str(rank_dir), None) for rank, rank_dir in rank_dirs.items()]
    bar = None
    if progress and workers > 1:
        from diag.progress import bar as progress_bar

        bar = progress_bar(2 * len(sources), "reading ranks")  # each rank counted once per stage
    try:
        read = TailRead(str(reader.path), rows, use_heartbeats)
        sides, judged, tables, per_rank = run_two_stage(
            read, sources, workers, progress=bar.update if bar is not None else None
        )
    finally:
        if bar is not None:
            bar.close()
    for rank in judged:
        sides[rank][1].judged_by_heartbeat = True
    reads = ((rank, _with_skipped(sides[rank][0], per_rank.get(rank))) for rank in rank_dirs)
    _, side = gather_rank_reads(reads, (), reader.dir_notes())
    data = {name: empty_table(table) for name, table in TABLES.items()}
    for name in TRIAGE_TABLES:
        data[name] = to_frame(tables[name], TABLES[name], rank_column=True)
    data.update(side, ranks=list(rank_dirs))
    infos = {rank: sides[rank][1] for rank in rank_dirs}
    beats = {rank: sides[rank][2] for rank in rank_dirs}
    return data, infos, beats, sum(cut for _, cut in per_rank.values())


@dataclass(frozen=True)
class Tails:
    """Tail rows of some ranks: per table its Arrow tables in their ranks' order, and per rank read (what was
    skipped, whether earlier rows were left unread). ``raw``: one rank's tables, slices of its decoded row groups,
    not yet copied into tables of their own."""

    tables: dict[str, list[pa.Table]] = field(default_factory=dict)
    per_rank: dict[int, tuple[list, bool]] = field(default_factory=dict)
    raw: bool = False

    @staticmethod
    def combine(*parts: Tails) -> Tails:
        """The parts in order, each run of raw ones copied into one contiguous table per table (their decoded row
        groups freed; a pipe pickles a few buffers, not thousands)."""
        tables: dict[str, list[pa.Table]] = {}
        for name in TRIAGE_TABLES:
            out, run = [], []
            for part in [*parts, Tails()]:
                if part.raw:
                    run += part.tables.get(name, [])
                    continue
                if run:
                    out.append(_copied(run))
                    run = []
                out += part.tables.get(name, [])
            if out:
                tables[name] = out
        return Tails(tables, {rank: read for part in parts for rank, read in part.per_rank.items()})


def _copied(parts: list[pa.Table]) -> pa.Table:
    """The parts' rows as one table in buffers of its own: one chunk a column, dictionaries unified."""
    arrow = pa.concat_tables(parts).unify_dictionaries()
    return arrow.combine_chunks() if len(parts) > 1 else arrow.take(np.arange(arrow.num_rows))


@dataclass(frozen=True)
class Listed:
    """A rank directory and its listing, kept between the stages (``nbytes``: what ``HeldStages`` counts)."""

    rank: int
    rank_dir: Path
    names: list[str]

    @property
    def nbytes(self) -> int:
        return 64 + sum(len(name) for name in self.names)


@dataclass(frozen=True)
class TailRead:
    """Triage's read of a trace's ranks as a two-stage analysis (``diag.analysis.engine.run_two_stage``). Stage
    1: each rank's side files (manifest, heartbeat, hang dumps), and the tables of the ranks no heartbeat can
    decide (none, or one without ``groups``; with ``use_heartbeats`` False, every rank's). Between the stages: the
    ranks judged from their heartbeats (``summary.judged_by_heartbeat``, over every rank's), and the broadcast,
    the ranks whose heartbeat could have decided them and did not. Stage 2: those ranks' tables. The result:
    (``{rank: (side read, dump info, heartbeat)}``, the ranks judged, ``{table name: [Arrow tables]}`` with the
    rows in the ranks' order, ``{rank: (skipped, cut)}`` of the ranks whose tables were read)."""

    path: str
    rows: int
    use_heartbeats: bool

    def first(self, sources: list) -> tuple[list[Listed], tuple[dict, Tails]]:
        reader = TraceReader(self.path, tables=())
        sides, kept, tails = {}, [], []
        for source in sources:
            rank, rank_dir = source.rank, Path(source.rank_dir)
            read, names, info, beat = _read_rank_side(reader, rank, rank_dir)
            sides[rank] = (read, info, beat)
            kept.append(Listed(rank, rank_dir, names))
            if not self.use_heartbeats or beat is None or beat.groups is None:  # never judged from its heartbeat
                tails.append(self._tail(reader, kept[-1]))
        return kept, (sides, Tails.combine(*tails))

    def combine(self, *partials: tuple[dict, Tails]) -> tuple[dict, Tails]:
        return {r: s for sides, _ in partials for r, s in sides.items()}, Tails.combine(*(t for _, t in partials))

    def between(self, partial: tuple[dict, Tails]) -> tuple[tuple, set[int]]:
        sides, tails = partial
        judged = _judged(sides, self.use_heartbeats)
        return (sides, judged, tails), {rank for rank in sides if rank not in judged and rank not in tails.per_rank}

    def second(self, listed: Listed, later: set[int]) -> Tails:
        return self._tail(TraceReader(self.path, tables=()), listed) if listed.rank in later else Tails(raw=True)

    def combine2(self, *partials: Tails) -> Tails:
        return Tails.combine(*partials)

    def finish(self, state: tuple, later: Tails) -> tuple[dict, set[int], dict[str, list[pa.Table]], dict]:
        """Stage 2's rows put in their ranks' places among stage 1's (a stable sort: each rank's rows keep their
        order)."""
        sides, judged, tails = state
        tables = {}
        for name in TRIAGE_TABLES:
            first, second = tails.tables.get(name, []), later.tables.get(name, [])
            tables[name] = first + second
            if first and second:
                arrow = pa.concat_tables(first + second)
                place = pd.Index(list(sides)).get_indexer(arrow["rank"].to_numpy())
                tables[name] = [arrow.take(np.argsort(place, kind="stable"))]
        return sides, judged, tables, {**tails.per_rank, **later.per_rank}

    def _tail(self, reader: TraceReader, listed: Listed) -> Tails:
        arrow, cut, skipped = _read_rank_tables(reader, listed.rank, listed.rank_dir, listed.names, self.rows)
        return Tails({name: [table] for name, table in arrow.items()}, {listed.rank: (skipped, cut)}, raw=True)


def _judged(sides: dict, use_heartbeats: bool) -> set[int]:
    """The ranks judged from their heartbeats (``sides``: ``{rank: (side read, dump info, heartbeat)}``)."""
    if not use_heartbeats or any(side[1].earlier is not None for side in sides.values()):
        return set()  # a restarted job: an earlier attempt is judged from its rows, which no heartbeat holds
    beats = {rank: side[2] for rank, side in sides.items()}
    member_of = {rank: _groups_of(side[0].manifest) for rank, side in sides.items()}
    return judged_by_heartbeat(beats, {rank for rank, side in sides.items() if side[1].stalls}, member_of)


def _groups_of(manifest: dict | None) -> set[str]:
    """The process groups a rank's manifest (as read: unchecked JSON) names: capture lists those torch holds in
    the rank's process, which are the groups it is a member of (a world group's member list, 16,384 ranks
    long, is not searched rank by rank)."""
    groups = (manifest or {}).get("process_groups")
    return {str(name) for name in groups} if isinstance(groups, dict) else set()


def _read_rank_side(reader: TraceReader, rank: int, rank_dir: Path):
    """One rank's side files: (the loader's per-rank read without tables, its directory's listing, its hang
    dumps, its heartbeat)."""
    read = reader.read_rank(rank, rank_dir)
    names = _listing(rank_dir, [])  # unreadable: read_rank said so
    started_us = (read.manifest or {}).get("start_time_us")
    info = _dump_info(rank, rank_dir, names, started_us if isinstance(started_us, int) else None)
    return read, names, info, Heartbeat.from_json(read.heartbeat)


def _read_rank_tables(reader: TraceReader, rank: int, rank_dir: Path, names: list[str], rows: int):
    """The last ``rows`` rows of a rank's steps and collectives (with its rank column; slices of what was decoded,
    ``Tails.combine`` copies them), whether earlier rows were left unread, and what was skipped."""
    skipped = []
    tables, cut = {}, False
    try:
        for name in TRIAGE_TABLES:
            tail = read_tail(reader, rank_dir, names, TABLES[name], rows, skipped, copy=False)
            cut |= tail.cut
            if tail.arrow is not None and tail.arrow.num_rows:
                column = pa.array(np.full(tail.arrow.num_rows, rank, dtype="int32"))
                tables[name] = tail.arrow.add_column(0, "rank", column)
    except Exception as exc:  # noqa: BLE001 - a damaged partition is named and left out, the others judged
        skipped.append(Skipped(str(rank_dir), f"steps and collectives unreadable, left out: {exc!r}"))
        return {}, False, skipped
    return tables, cut, skipped


def _with_skipped(read: RankRead, tail: tuple[list, bool] | None) -> RankRead:
    """A rank's side read with what reading its tables skipped."""
    return read if tail is None else dataclasses.replace(read, skipped=read.skipped + tail[0])


def _steps_of(reader: TraceReader, rank_dirs: dict[int, Path], rows: int) -> pd.DataFrame | None:
    """The last ``rows`` steps of these ranks, in the columns ``TriageInput.steps`` has."""
    steps = _tails_of(reader, rank_dirs, "steps", rows)
    return None if steps is None else steps[["rank", "step", "duration_us", "comm_wait_us", "data_wait_us"]]


def _ops_of(reader: TraceReader, rank_dirs: dict[int, Path], rows: int) -> pd.DataFrame | None:
    """The last ``rows`` collectives of these ranks, as ``TriageInput.ops`` rows."""
    collectives = _tails_of(reader, rank_dirs, "collectives", rows)
    return None if collectives is None else _diag_ops(collectives)


def _tails_of(reader: TraceReader, rank_dirs: dict[int, Path], name: str, rows: int) -> pd.DataFrame | None:
    """The last ``rows`` rows of table ``name`` of these ranks (None: none)."""
    chunks = []
    for rank, rank_dir in rank_dirs.items():
        tail = read_tail(reader, rank_dir, _listing(rank_dir, []), TABLES[name], rows, [])
        if tail.arrow is not None and tail.arrow.num_rows:
            chunks.append(tail.arrow.add_column(0, "rank", pa.array(np.full(tail.arrow.num_rows, rank, dtype="int32"))))
    return to_frame(chunks, TABLES[name], rank_column=True) if chunks else None


def _with_heartbeat_ops(ops: pd.DataFrame, heartbeats: dict[int, Heartbeat]) -> pd.DataFrame:
    """The rows the heartbeats of the ranks judged from them stand in for (diag/triage/summary.py)."""
    rows = [row for rank, heartbeat in heartbeats.items() for row in heartbeat_ops(rank, heartbeat)]
    if not rows:
        return ops
    frame = pd.DataFrame(rows, columns=OPS_COLUMNS)
    return frame if ops.empty else pd.concat([ops, frame], ignore_index=True)


def _dump_info(rank: int, rank_dir: Path, names: list[str], started_us: int | None = None) -> RankInfo:
    """What the rank's hang dumps and fatal-signal stacks say (``names``: its directory's listing); the
    heartbeat and manifest fields are filled in by the caller. ``started_us``: when the latest attempt's
    diag.init ran (its manifest's start): the dumps written before it, and the heartbeat a restart kept, are
    the earlier attempt's (``RankInfo.earlier``)."""
    info = RankInfo(rank)
    numbered = ((hang_dump_number(name), rank_dir / name) for name in names)
    dumps = sorted((number, p) for number, p in numbered if number is not None)
    info.dumps = len(dumps)
    read = [(path, HangDump.from_json(_read_json(path))) for _, path in dumps[-MAX_DUMPS_READ:]]
    earlier_beat = _earlier_heartbeat(rank_dir, names)
    if started_us is not None:
        before = [(path, dump) for path, dump in read if dump is not None and (dump.time_us or 0) < started_us]
        if before or earlier_beat is not None:
            info.earlier = _with_dumps(RankInfo(rank, heartbeat=earlier_beat), before)
            info.earlier.dumps = len(before)
            earlier_paths = {path for path, _ in before}
            read = [(path, dump) for path, dump in read if path not in earlier_paths]
    _with_dumps(info, read)
    fatal = rank_dir / FATAL_STACKS_FILE
    with contextlib.suppress(OSError):  # absent, or a FIFO/device planted under the name
        info.fatal_stacks = read_file_bytes(fatal)[:20000].decode("utf-8", "replace") or None
    return info


def _earlier_heartbeat(rank_dir: Path, names: list[str]) -> Heartbeat | None:
    """The last heartbeat of the attempt before the latest, kept by the restart (the highest numbered)."""
    kept = sorted((n, name) for name in names if (n := earlier_heartbeat_number(name)) is not None)
    return Heartbeat.from_json(_read_json(rank_dir / kept[-1][1])) if kept else None


def _with_dumps(info: RankInfo, dumps: list[tuple[Path, HangDump | None]]) -> RankInfo:
    """``info`` with what its hang dumps (oldest first) say: its stalls, the latest stall and signal dumps."""
    for _path, dump in reversed(dumps):
        if dump is None:
            continue
        reason = dump.reason or ""
        info.last_dump = info.last_dump or dump
        if reason.startswith("stall"):
            info.last_stall = info.last_stall or dump
            info.stalls.append(reason)
            info.first_stall_us = float(dump.time_us) if dump.time_us else info.first_stall_us
        if info.stall_dump is None and reason.startswith(("stall", "signal")) and dump.main_frames():
            info.stall_dump = dump
    return info


def _diag_ops(collectives: pd.DataFrame) -> pd.DataFrame:
    if collectives.empty:
        return pd.DataFrame(columns=OPS_COLUMNS)
    frame = collectives[collectives["peer"].isna() & (collectives["seq"] >= 0)]
    return pd.DataFrame(
        {
            "rank": frame["rank"].astype("int64"),
            "pg": frame["pg"].astype(str),
            "seq": frame["seq"].astype("int64"),
            "op": frame["op"].astype(str),
            "bytes": frame["bytes"].astype("int64"),
            "dtype": frame["dtype"].astype(str),
            "sizes": frame["bytes"].astype(str) + " B",
            "completed": frame["duration_us"].notna(),
            "start_us": frame["start_us"].astype("float64"),
            "step": frame["step"].astype("int64"),
            "call_site": "",
            "source": "diag",
            "shape": "",
        }
    )


def _add_pending_from_dumps(
    ops: pd.DataFrame, ranks: dict[int, RankInfo], started_us: dict[int, float] | None = None
) -> pd.DataFrame:
    """Collectives pending in the latest dump or heartbeat of each attempt: a rank stuck in one never writes its
    row. ``started_us``: when each rank's latest attempt started; a restart numbers its collectives from the
    start again, so an earlier attempt's pending op is never the same op as the restart's at that seq."""
    rows = []
    for rank, info in ranks.items():
        for attempt in (info, info.earlier):
            if attempt is not None:
                rows += _pending_rows(rank, attempt)
    if not rows:
        return ops
    combined = pd.concat([ops, pd.DataFrame(rows, columns=OPS_COLUMNS)], ignore_index=True)
    # a row written at completion wins over the same op seen pending earlier
    combined = combined.sort_values("completed", ascending=False, kind="stable")
    started = combined["rank"].map(started_us or {}).astype("float64")
    latest = combined.assign(_latest=~(combined["start_us"].astype("float64") < started))
    return _one_row_per_op(latest, also=["_latest"]).drop(columns="_latest").reset_index(drop=True)


def _pending_rows(rank: int, info: RankInfo) -> list[dict]:
    """The ops rows of what one attempt's latest stall dump, dump or heartbeat shows pending."""
    pending, rows = [], []
    for source in (info.stall_dump, info.last_dump, info.heartbeat):
        if source and source.pending:
            pending = source.pending
            break
    for p in pending:
        if p.peer is None and p.seq is not None and p.seq >= 0:
            rows.append(
                {
                    "rank": rank,
                    "pg": str(p.pg),
                    "seq": p.seq,
                    "op": str(p.op),
                    "bytes": p.bytes or 0,
                    "dtype": p.dtype or "",
                    "sizes": f"{p.bytes or 0} B",
                    "completed": False,
                    "start_us": float(p.start_us or 0),
                    "step": p.step if p.step is not None else -1,
                    "call_site": "",
                    "source": "diag-dump",
                    "shape": "",
                }
            )
    return rows


def _merge_fr(ops: pd.DataFrame, fr_frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Add Flight Recorder entries diag has no row for (diag's own collectives excluded, ops that raised),
    and take call sites from Flight Recorder where diag has none. Of a group diag has no row of at all (a
    tensor-parallel group's functional collectives), the rank's newest entry is kept even when it reads
    completed: gloo counts an op that timed out as completed, and when each member entered it tells who
    waited for whom (analysis._waited_for_latecomers)."""
    fr_frames = [f for f in fr_frames if len(f)]
    if not fr_frames:
        return ops
    fr = pd.concat(fr_frames, ignore_index=True)
    if ops.empty:
        return fr
    last_seen = ops.groupby(["rank", "pg"])["seq"].max().rename("diag_last_seq").reset_index()
    fr = fr.merge(last_seen, on=["rank", "pg"], how="left")
    beyond = fr[fr["diag_last_seq"].isna() | (fr["seq"] > fr["diag_last_seq"])]
    # diag writes a row when an op returns, and the dump flushed those rows first: an entry past diag's last
    # row was entered and never returned. gloo even counts an op that failed (peer gone) as completed.
    known = beyond["diag_last_seq"].notna()
    newest_of_unknown_group = ~known & (beyond["seq"] == beyond.groupby(["rank", "pg"])["seq"].transform("max"))
    beyond = beyond.drop(columns="diag_last_seq")
    beyond.loc[known.to_numpy(), "completed"] = False
    beyond.loc[known.to_numpy(), "source"] = "flight_recorder (never returned)"
    by_key = fr.set_index(["rank", "pg", "seq"])
    keys = pd.MultiIndex.from_frame(ops[["rank", "pg", "seq"]])
    ops = ops.copy()
    ops["call_site"] = by_key["call_site"].reindex(keys).fillna("").to_numpy()
    ops["shape"] = by_key["shape"].reindex(keys).fillna("").to_numpy()  # diag records bytes, FR the shapes
    return pd.concat([ops, beyond[~beyond["completed"] | newest_of_unknown_group]], ignore_index=True)


def _pg_ranks_from_manifests(trace, world_size: int) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for manifest in trace.manifests.values():
        for name, group in manifest.process_groups.items():
            if group.ranks:  # a group whose members were not listed (or none valid) tells nothing of them
                groups.setdefault(name, list(group.ranks))
    groups.setdefault("0", list(range(world_size)))
    return groups


# -- Flight Recorder dump directories ----------------------------------------------------------------------------


def _fr_mesh(dumps: dict[int, FRDump], pg_ranks: dict[str, list[int]]) -> MeshLayout | None:
    """The device mesh from the groups' descriptions, in pg_config or (gloo's, whose pg_config lists only the
    default group) on the entries."""
    described = {(name, desc) for d in dumps.values() for name, desc in d.pg_desc.items()}
    described |= {(e.pg, e.pg_desc) for d in dumps.values() for e in d.entries}
    return MeshLayout.from_groups(
        (name, dimension_of(desc), pg_ranks.get(name, ())) for name, desc in sorted(described)
    )


def read_fr_dir(path: Path) -> TriageInput:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    files = [p for p in files if not nccl_ras.is_ras_file(p.name)]  # read by with_nccl_ras
    skipped, dumps = [], {}
    for file in files:
        try:
            dump = load_dump(file)
        except DumpRejected as exc:
            skipped.append(Skipped(str(file), str(exc)))
            continue
        if not 0 <= dump.rank <= MAX_RANK:
            skipped.append(Skipped(str(file), f"rank {dump.rank} is above {MAX_RANK}: not a real job's"))
            continue
        if dump.rank in dumps:
            skipped.append(Skipped(str(file), f"a second dump for rank {dump.rank} (kept {dumps[dump.rank].path})"))
            continue
        dumps[dump.rank] = dump
    if not dumps:
        reasons = "; ".join(str(s) for s in skipped[:5]) or "the directory is empty"
        raise TraceError(
            f"{path} holds neither a diag trace (rank00000/, ...) nor readable Flight Recorder dumps "
            f"(<prefix><rank>, pickle or JSON): {reasons}"
        )
    dumps = dict(sorted(dumps.items()))  # analysis never depends on the order files were listed in
    configured: dict[str, list[int]] = {}
    for dump in dumps.values():
        for name, members in dump.pg_ranks.items():
            if members:
                configured.setdefault(name, members)
    world_size = max([max(dumps) + 1, *(max(m) + 1 for m in configured.values() if m)])
    pg_ranks = fr_checks.infer_members(dumps, configured, world_size)
    inferred = sorted(pg for pg in pg_ranks if pg not in configured and pg != "0")
    ranks = {
        r: RankInfo(r, fr_last=_last_entry(d), backend=d.entries[0].backend if d.entries else None)
        for r, d in dumps.items()
    }
    for rank in range(world_size):
        ranks.setdefault(rank, RankInfo(rank, has_data=False))
    gloo = any(e.backend == "gloo" for d in dumps.values() for e in d.entries[:1])
    groups = {r: fr_checks.op_groups(d) for r, d in dumps.items()}
    # gloo's last_completed_collective lags: what every member went past returned (NCCL records completion)
    floors = fr_checks.returned_below(groups, pg_ranks) if gloo else {}
    returned = fr_checks.returned_on_a_member(groups, pg_ranks) if gloo else set()
    frames = [fr_ops_frame(d, groups[r], floors, returned) for r, d in dumps.items()]
    ops = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=FR_OPS_COLUMNS)
    problems = fr_checks.all_to_all_problems(groups, pg_ranks)
    p2p, p2p_notes = fr_checks.p2p_problems(dumps, pg_ranks)
    notes = []
    if gloo:
        notes.append(
            "gloo dumps: gloo records no completion state, and counts an op that failed as completed; "
            "a collective some members never issued is taken as never completed"
        )
    if inferred:
        notes.append(
            f"members of process groups {', '.join(inferred)} taken from the dumps that list them "
            "(the dumps' pg_config does not name them)"
        )
    notes += p2p_notes
    wrapped = {r: d.lost_entries for r, d in dumps.items() if d.lost_entries}
    if wrapped:
        lost = ", ".join(f"rank {r}: {n}" for r, n in sorted(wrapped.items())[:8])
        notes.append(
            f"ring buffer wrapped, oldest entries overwritten ({lost}): collectives before a dump's first entry "
            "are not judged (raise TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE on older torch)"
        )
    no_dump = sorted(r for r, info in ranks.items() if not info.has_data)
    if no_dump:
        notes.append(f"no Flight Recorder dump for ranks {no_dump}: their processes may have died before dumping")
    return TriageInput(
        path,
        "flight_recorder",
        world_size,
        ops,
        ranks,
        pg_ranks,
        skipped,
        None,
        notes,
        not gloo,
        fr_problems=problems + p2p,
        mesh=_fr_mesh(dumps, pg_ranks),
    )


FR_OPS_COLUMNS = [*OPS_COLUMNS, "state"]  # Flight Recorder's state: scheduled, started (NCCL), completed


def fr_ops_frame(
    dump: FRDump,
    groups: list | None = None,
    returned_below: dict[str, int] | None = None,
    returned: set[tuple[str, int]] | None = None,
) -> pd.DataFrame:
    """One row per (pg, seq) of the rank: a coalesced group is one row describing every op in it, and each
    op is described by what all members must agree on (``fr_checks.comparable``). ``returned_below`` and
    ``returned``: what gloo's lagging completion count misses (``fr_checks``)."""
    rows = []
    returned_below = returned_below or {}
    returned = returned or set()
    for group in fr_checks.op_groups(dump) if groups is None else groups:
        first, last = group.ops[0], group.last
        described = [fr_checks.comparable(e) for e in group.ops]
        dtype_name = next((d[0] for _, d, _ in described if d), "")
        dtype, element_bytes = SCALAR_TYPES.get(dtype_name, (str(dtype_name), 0)) if dtype_name else ("", 0)
        numel = sum(fr_checks.comparable_numel(e) for e in group.ops)
        completed = last.completed or last.seq < returned_below.get(last.pg, -1) or (last.pg, last.seq) in returned
        rows.append(
            (
                dump.rank,
                last.pg,
                last.seq,
                group.op,
                numel * element_bytes,
                dtype,
                "; ".join(sizes_text(e.input_sizes) for e in group.ops),
                completed,
                first.time_created_ns / 1000 if first.time_created_ns else float("nan"),
                -1,
                first.call_site,
                "flight_recorder",
                "; ".join(text for _, _, text in described),
                _group_state(group),
            )
        )
    frame = pd.DataFrame(rows, columns=FR_OPS_COLUMNS)
    # a ring buffer may hold one seq twice after a wrap: keep the newest
    return _one_row_per_op(frame, keep="last")


def is_p2p(frame: pd.DataFrame) -> pd.Series:
    """The rows that are sends and receives: numbered by a counter of their own, so a pipeline's send at seq 3
    and the group's all_reduce at seq 3 are two ops."""
    return frame["op"].astype(str).isin(P2P_OPS)


def _one_row_per_op(frame: pd.DataFrame, keep: str = "first", also: list[str] | None = None) -> pd.DataFrame:
    """One row per rank and (group, seq), counted apart for sends and receives (``is_p2p``) and by the columns
    ``also``."""
    keys = ["rank", "pg", "seq", "_p2p", *(also or [])]
    return frame.assign(_p2p=is_p2p(frame)).drop_duplicates(keys, keep=keep).drop(columns="_p2p")


def _group_state(group) -> str:
    """A coalesced group ran as far as its least advanced op."""
    order = {"scheduled": 0, "started": 1, "completed": 2}
    states = [e.state for e in group.entries if e.state in order]
    return min(states, key=order.get) if states else ""


def _last_entry(dump: FRDump) -> dict | None:
    if not dump.entries:
        return None
    last = dump.entries[-1]
    op = f"{last.op} {last.src}->{last.dst}" if last.src is not None else last.op  # send/recv with their peers
    return {"pg": last.pg, "seq": last.seq, "op": op, "completed": last.completed, "call_site": last.call_site}


# -- small helpers ---------------------------------------------------------------------------------------------


def main_frames(dump: HangDump | None) -> list[dict]:
    return dump.main_frames() if dump else []


def _read_json(path: Path) -> dict | None:
    try:
        value = load_json_limited(path)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def _gpu_name(manifest: Manifest) -> str | None:
    if manifest.gpu_uuid:
        return manifest.gpu_uuid
    if manifest.gpu_index is not None:
        return f"{manifest.host or '?'}:{manifest.gpu_index}"
    return None
