"""Load PyTorch Flight Recorder dumps (pickle or JSON; NCCL and gloo variants) safely and normalise them.

Dumps are pickles written by ``_dump_fr_trace`` / ``_dump_nccl_trace`` or by the ``TORCH_FR_DUMP_TEMP_FILE`` /
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` prefixes. A pickle can run arbitrary code when loaded, so they are only
ever read with ``RestrictedUnpickler``: it builds plain containers and scalars and refuses every class or
function lookup, which is the only way a pickle can call code. Needs no torch.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diag.trace.json_values import INT64_MAX, finite
from diag.trace.schema import MAX_RANK

# Types a Flight Recorder dump is made of; anything else means the file is not a dump (or is hostile).
PLAIN_TYPES = (dict, list, tuple, set, frozenset, str, bytes, int, float, bool, type(None))
MAX_DUMP_BYTES = 512 << 20  # refuse to read more than this into memory (real dumps: tens of MB)
# Bounds on the shape of what a dump may unpickle to, so that a crafted file (a list containing itself, a
# memo graph referencing one container millions of times, 100000 levels of nesting) is refused in bounded time
# instead of hanging triage: real dumps are a few levels deep and at most a few million values.
MAX_DUMP_DEPTH = 32
MAX_DUMP_NODES = 20_000_000
TRAILING_RANK_RE = re.compile(r"^(.*?)(\d+)(\.pkl|\.pickle|\.json)?$")
DEFAULT_PG = "0"  # c10d names the default process group "0"
# Frames from these paths are the machinery under a call, not the call site a user wants to see.
LIBRARY_PATH_PARTS = (
    "site-packages/torch/",
    "/torch/distributed/",
    "/torch/nn/",
    "/torch/utils/",
    "/diag/capture/",
    "<frozen ",
    "/threading.py",
)


class DumpRejected(Exception):
    """The file is not a Flight Recorder dump diag can read safely; the message says why."""


class Refused(pickle.UnpicklingError):
    """The pickle asked for a class or function: it is not plain data."""


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that only builds dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None."""

    def find_class(self, module: str, name: str):  # every GLOBAL / STACK_GLOBAL / INST / OBJ / EXT goes here
        raise Refused(f"refused to load {module}.{name}: dumps may only hold plain data")

    def persistent_load(self, pid):
        raise Refused("refused a persistent id: dumps may only hold plain data")


def restricted_loads(data: bytes) -> Any:
    value = RestrictedUnpickler(io.BytesIO(data)).load()
    _check_plain(value)
    return value


def _check_plain(value: Any) -> None:
    """Plain data only, no cycles, at most MAX_DUMP_DEPTH deep and MAX_DUMP_NODES visits: an iterative DFS that
    tracks the containers on the current path (a cycle) and those already checked (a shared one is not walked
    twice, so a memo graph costs what its file costs)."""
    on_path: set[int] = set()
    checked: set[int] = set()
    visits = 0
    stack: list[tuple[Any, int, bool]] = [(value, 0, False)]
    while stack:
        item, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            checked.add(id(item))
            continue
        visits += 1
        if visits > MAX_DUMP_NODES:
            raise Refused(f"more than {MAX_DUMP_NODES} values: not a Flight Recorder dump")
        if not isinstance(item, PLAIN_TYPES):
            raise Refused(f"unexpected {type(item).__name__} in dump")
        if not isinstance(item, (dict, list, tuple, set, frozenset)):
            continue
        key = id(item)
        if key in on_path:
            raise Refused("a container that contains itself (a cycle): not a Flight Recorder dump")
        if key in checked:
            continue
        if depth >= MAX_DUMP_DEPTH:
            raise Refused(f"nested deeper than {MAX_DUMP_DEPTH} levels: not a Flight Recorder dump")
        on_path.add(key)
        stack.append((item, depth, True))
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        stack.extend((child, depth + 1, False) for child in children)


@dataclass(frozen=True)
class FREntry:
    """One Flight Recorder record, normalised across NCCL and gloo and across pickle and JSON."""

    pg: str  # process group name, as the trace's collectives.pg column names it ("0" is the default group)
    pg_desc: str
    seq: int  # collective_seq_id, or p2p_seq_id for point-to-point ops
    is_p2p: bool
    op: str  # "all_reduce", "all_gather", "send", ... (backend prefix removed)
    backend: str  # "nccl", "gloo", ...
    input_sizes: tuple
    input_dtypes: tuple
    output_sizes: tuple
    state: str  # "scheduled", "started", "completed" as recorded
    completed: bool  # completion as best known: NCCL state, else the group's last_completed_collective
    time_created_ns: int | None
    duration_ms: float | None
    frames: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost first
    output_dtypes: tuple = ()
    # point-to-point ops: "send 0->1" / "recv 1<-0" name the group-local source and destination ranks
    src: int | None = None
    dst: int | None = None
    # all_to_all: elements sent to / received from each peer, in group rank order (dump version 2.11 on)
    input_split_sizes: tuple = ()
    output_split_sizes: tuple = ()
    # torch's id of the group object (``pg_id``), counted in creation order in the process: after
    # destroy_process_group() a new group takes the old one's name ("0") but a new id
    pg_uid: int | None = None

    @property
    def call_site(self) -> str:
        """The first frame outside torch: where user code issued the op."""
        for name, filename, line in self.frames:
            if not is_library_file(filename):
                return f"{filename}:{line} in {name}"
        return ""


def is_library_file(filename: str) -> bool:
    """Frames the user did not write (torch, diag's wrappers, threading): skipped to find a call site."""
    return any(part in filename for part in LIBRARY_PATH_PARTS)


@dataclass
class FRDump:
    path: str
    rank: int
    version: str
    pg_ranks: dict[str, list[int]]  # pg name -> global ranks
    pg_desc: dict[str, str]
    last_completed_seq: dict[str, int]  # pg name -> last completed collective seq (-1 unknown)
    entries: list[FREntry] = field(default_factory=list)
    lost_entries: int = 0  # the oldest entries the ring buffer overwrote before the dump


def read_dump_file(path: str | Path) -> Any:
    """Parse a dump file (pickle or JSON) into plain Python data. Raises DumpRejected."""
    path = Path(path)
    from diag.trace.loader import read_file_bytes  # regular files only: a FIFO must not hang triage

    try:
        data = read_file_bytes(path, max_bytes=MAX_DUMP_BYTES)
    except OSError as exc:
        raise DumpRejected(f"unreadable: {exc}") from exc
    if not data:
        raise DumpRejected("empty file")
    if data[:1] in (b"{", b"[") or data.lstrip()[:1] == b"{":
        try:
            value = json.loads(data)
            _check_plain(value)
            return value
        except (ValueError, RecursionError) as exc:
            raise DumpRejected(f"not valid JSON: {type(exc).__name__}: {exc}") from exc
        except Refused as exc:
            raise DumpRejected(f"rejected JSON: {exc}") from exc
    if data[:1] != b"\x80":
        raise DumpRejected("neither a pickle nor JSON")
    try:
        return restricted_loads(data)
    except Refused as exc:
        raise DumpRejected(f"rejected pickle: {exc}") from exc
    except Exception as exc:  # truncated or corrupt pickles raise EOFError, ValueError, ...
        raise DumpRejected(f"corrupt pickle: {type(exc).__name__}: {exc}") from exc


def rank_from_file_name(path: str | Path) -> int | None:
    """``<prefix><rank>`` as TORCH_FR_DUMP_TEMP_FILE writes it; ``rankNNNNN/fr_dump.pkl`` in a diag trace."""
    path = Path(path)
    match = TRAILING_RANK_RE.match(path.name)
    if match:
        return int(match.group(2))
    parent = re.match(r"^rank(\d+)$", path.parent.name)
    return int(parent.group(1)) if parent else None


def load_dump(path: str | Path, rank: int | None = None) -> FRDump:
    """Read and normalise one dump. Raises DumpRejected with the reason when it cannot be used."""
    raw = read_dump_file(path)
    rank = rank if rank is not None else rank_from_file_name(path)
    if rank is None:
        raise DumpRejected("no rank in the file name (expected <prefix><rank>, e.g. nccl_trace_rank_3)")
    return normalise_dump(raw, str(path), rank)


def normalise_dump(raw: Any, path: str, rank: int) -> FRDump:
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise DumpRejected("not a Flight Recorder dump (no 'entries' list)")
    pg_ranks, pg_desc = _pg_config(raw.get("pg_config") or {})
    entries = [_entry(e) for e in raw.get("entries", []) if isinstance(e, dict)]
    _fix_unnamed_default_pg(pg_ranks, pg_desc, entries)
    last_completed = {
        str(k): _int(v.get("last_completed_collective"), -1)
        for k, v in _dict(raw.get("pg_status")).items()
        if isinstance(v, dict)
    }
    entries = [_with_completion(e, last_completed) for e in entries]
    by_name = _by_group_name(last_completed, entries)
    dump = FRDump(path, rank, str(raw.get("version", "")), pg_ranks, pg_desc, by_name, entries)
    dump.lost_entries = _lost_to_wrap(raw["entries"])
    return dump


def _lost_to_wrap(raw_entries: list) -> int:
    """Entries the ring buffer (TORCH_FR_BUFFER_SIZE long) overwrote: record ids count every op recorded from 0,
    so the oldest one kept says how many came before it."""
    first = next((e for e in raw_entries if isinstance(e, dict)), None)
    return max(0, _int(first.get("record_id"), 0)) if first else 0


def _pg_config(config: Any) -> tuple[dict[str, list[int]], dict[str, str]]:
    ranks, desc = {}, {}
    for key, value in _dict(config).items():
        value = _dict(value)
        name = str(value.get("name", key) if key == "" else key)
        ranks[name] = _rank_list(value.get("ranks"))
        desc[name] = str(value.get("desc", ""))
    return ranks, desc


def _fix_unnamed_default_pg(pg_ranks: dict, pg_desc: dict, entries: list[FREntry]) -> None:
    """gloo dumps key the default group's pg_config by '' while entries name it ('0', 'default_pg')."""
    if "" in pg_ranks and DEFAULT_PG not in pg_ranks and any(e.pg == DEFAULT_PG for e in entries):
        pg_ranks[DEFAULT_PG] = pg_ranks.pop("")
        pg_desc[DEFAULT_PG] = pg_desc.pop("") or "default_pg"


def _entry(raw: dict) -> FREntry:
    pg = raw.get("process_group") or (raw.get("pg_id", DEFAULT_PG), "")
    pg_name, desc = (str(pg[0]), str(pg[1]) if len(pg) > 1 else "") if isinstance(pg, (list, tuple)) else (str(pg), "")
    profiling_name = str(raw.get("profiling_name", ""))
    backend, _, op = profiling_name.rpartition(":")
    op, src, dst = _p2p_peers(op or profiling_name)
    is_p2p = bool(raw.get("is_p2p", False))
    seq = _int(raw.get("p2p_seq_id") if is_p2p else raw.get("collective_seq_id"), -1)
    duration = raw.get("duration_ms")
    return FREntry(
        pg=pg_name,
        pg_desc=desc,
        seq=seq,
        is_p2p=is_p2p,
        op=op,
        backend=backend,
        input_sizes=_freeze(raw.get("input_sizes", [])),
        input_dtypes=_dtypes(raw.get("input_dtypes", [])),
        output_sizes=_freeze(raw.get("output_sizes", [])),
        state=str(raw.get("state", "")),
        completed=False,
        time_created_ns=_int(raw.get("time_created_ns"), None),
        duration_ms=finite(duration),
        frames=tuple(_frames(raw.get("frames"))),
        output_dtypes=_dtypes(raw.get("output_dtypes", [])),
        src=src,
        dst=dst,
        input_split_sizes=_int_tuple(raw.get("input_split_sizes")),
        output_split_sizes=_int_tuple(raw.get("output_split_sizes")),
        pg_uid=_int(raw.get("pg_id"), None) if raw.get("process_group") else None,
    )


P2P_NAME_RE = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")


def _p2p_peers(op: str) -> tuple[str, int | None, int | None]:
    """("send", 0, 1) for "send 0->1" and ("recv", 0, 1) for "recv 1<-0" (group-local ranks, as NCCL names them)."""
    match = P2P_NAME_RE.match(op.strip())
    if not match:
        return op, None, None
    kind, first, arrow, second = match.group(1), int(match.group(2)), match.group(3), int(match.group(4))
    src, dst = (first, second) if arrow == "->" else (second, first)
    return kind, src, dst


def _dtypes(value: Any) -> tuple:
    """A list of dtype names; one name alone where a writer gave a string (PyTorch's own analyser tests do)."""
    return (value,) if isinstance(value, str) and value else _freeze(value)


def _int_tuple(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)):
        return ()
    numbers = tuple(_int(v, None) for v in value)
    return () if None in numbers else numbers


def _by_group_name(by_uid: dict[str, int], entries: list[FREntry]) -> dict[str, int]:
    """pg_status re-keyed by group name. Its keys are the groups' ids, counted per rank over the groups it is a
    member of: on a device mesh rank 3's dp group "2" is id 1 and its tp group "4" id 2, while group "1" is
    another dp group. An entry gives an id's name; an id no entry names stays only where it is no other id's name
    (as when every group was made on every rank, and ids equal names)."""
    names: dict[str, str] = {}
    for entry in entries:
        if entry.pg_uid is not None:
            names.setdefault(str(entry.pg_uid), entry.pg)
    taken = set(names.values())
    out: dict[str, int] = {}
    for uid, seq in sorted(by_uid.items(), key=lambda item: _int(item[0], -1)):  # a re-made group: its newest id
        if uid in names:
            out[names[uid]] = seq
        elif uid not in taken:
            out[uid] = seq
    return out


def _with_completion(entry: FREntry, last_completed: dict[str, int]) -> FREntry:
    # gloo never sets state=completed; its pg_status still counts completed collectives. pg_status is keyed by
    # the group's id, which equals its name until groups are made again after destroy_process_group()
    key = str(entry.pg_uid) if entry.pg_uid is not None and str(entry.pg_uid) in last_completed else entry.pg
    done = entry.state == "completed" or (not entry.is_p2p and 0 <= entry.seq <= last_completed.get(key, -1))
    return entry if done == entry.completed else replace(entry, completed=done)


def _frames(raw: Any) -> list[tuple[str, str, int]]:
    frames = []
    for frame in raw if isinstance(raw, (list, tuple)) else ():
        if isinstance(frame, dict):
            frames.append((str(frame.get("name", "")), str(frame.get("filename", "")), _int(frame.get("line"), 0)))
    return frames


def _freeze(value: Any) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) if isinstance(v, (list, tuple)) else v for v in value)
    return ()


def _rank_list(value: Any) -> list[int]:
    if isinstance(value, str):  # "[0, 1]" in both pickle and JSON dumps
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return (
        [
            int(r)
            for r in value
            if isinstance(r, (int, str))
            and len(str(r)) < 20
            and str(r).isascii()
            and str(r).isdigit()
            and int(r) <= MAX_RANK
        ]
        if isinstance(value, (list, tuple))
        else []
    )


def _int(value: Any, default):
    """A whole number an int64 holds (a seq, a time in ns, a line), from a number or its digits; ``default``
    otherwise: None, text, nan, inf, more digits than int() takes, 10**30 (which would overflow later)."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -INT64_MAX <= number <= INT64_MAX else default


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def sizes_text(sizes: tuple) -> str:
    return ",".join("x".join(map(str, s)) if isinstance(s, tuple) else str(s) for s in sizes) or "-"
