"""Read a trace directory into pandas DataFrames. Needs no torch and never fails on bad input:
whatever cannot be read is listed in ``Trace.skipped`` with the reason, and the rest is returned.

``TraceReader`` remembers how far it read each file, so a live view can call ``poll()`` to get only the
rows appended since its last call; ``load()`` is one full read.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from diag.progress import NoBar
from diag.progress import bar as progress_bar
from diag.trace import json_values
from diag.trace.columnar import ARROW_TYPES, TableSegments
from diag.trace.manifest import Manifest, first_of, parse_manifests
from diag.trace.memory_deep import read_memory_deep
from diag.trace.nccl_log import NcclLog, parse_text
from diag.trace.records import Heartbeat
from diag.trace.schema import (
    CSV_SCHEMA_VERSION,
    EVENTS_FILE,
    HEARTBEAT_FILE,
    MANIFEST_FILE,
    MAX_RANK,
    NCCL_LOG_FILE,
    TABLES,
    Table,
    parse_marker,
)

RANK_DIR_RE = re.compile(r"^rank(\d+)$")
READ_THREADS = min(4, os.cpu_count() or 1)  # parsing ranks in parallel; pyarrow releases the GIL

_ARROW_TYPES = ARROW_TYPES  # v1 CSV and v2 segments read into the same Arrow types, so ranks concatenate


class TraceError(Exception):
    """Nothing in the directory can be analysed; the message says why and what was expected."""


# Limits on what is read from input (docs/reliability.md): a small JSON file that is huge or deeply nested is
# not one diag wrote, and reading it whole would only exhaust memory or the stack.
MAX_JSON_FILE_BYTES = 16 << 20  # manifest.json, heartbeat.json, hang dumps
MAX_JSON_DEPTH = 64
# NCCL's log: what diag reads of it comes first (init), so a larger file (a user's NCCL_DEBUG_SUBSYS=ALL run
# into it) is read up to this, not refused
MAX_NCCL_LOG_BYTES = 8 << 20


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a file was expected: never opened for reading in full."""


def read_file_bytes(path: str | Path, offset: int = 0, max_bytes: int | None = None, head: bool = False) -> bytes:
    """The bytes of the regular file ``path`` from ``offset``. Opened non-blocking, so a FIFO planted under the
    name cannot hang the reader, and checked with fstat before anything is read: FIFOs, /dev/zero and other
    non-regular files raise NotRegularFile, files over ``max_bytes`` raise OSError(EFBIG), or with ``head``
    give their first ``max_bytes``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        if max_bytes is not None and info.st_size - offset > max_bytes and not head:
            raise OSError(27, f"{info.st_size} bytes, more than the {max_bytes} diag reads from such a file", str(path))
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            handle.seek(offset)
            return handle.read() if max_bytes is None else handle.read(max_bytes + 1)[:max_bytes]
    finally:
        if fd >= 0:
            os.close(fd)


def json_depth_ok(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the brackets of a JSON text nest at most ``max_depth`` deep (strings ignored), checked before
    ``json.loads``: deep nesting would raise RecursionError or take the stack with it."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    if text.count(b"[") + text.count(b"{") <= max_depth:
        return True
    depth, in_string, escaped = 0, False, False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def load_json_limited(path: str | Path, max_bytes: int = MAX_JSON_FILE_BYTES):
    """json.loads of a small regular file, with the size and nesting limits. Raises OSError or ValueError."""
    data = read_file_bytes(path, max_bytes=max_bytes)
    if not json_depth_ok(data):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(data)


@dataclass
class Skipped:
    path: str
    reason: str
    lines: int = 0  # rows lost, when the reason concerns rows

    def __str__(self) -> str:
        suffix = f" ({self.lines} lines)" if self.lines else ""
        return f"{self.path}: {self.reason}{suffix}"


@dataclass
class Trace:
    """All ranks of one run. Each table has a ``rank`` column; units are in the column names."""

    path: Path
    steps: pd.DataFrame
    phases: pd.DataFrame
    collectives: pd.DataFrame
    memory: pd.DataFrame
    telemetry: pd.DataFrame
    microbatches: pd.DataFrame  # pipeline parallelism; empty for runs without it
    calibration: pd.DataFrame  # the machine-speed calibration (diag/capture/calibration.py); empty before it
    manifests: dict[int, Manifest]  # by rank, ascending; ranks without a manifest.json are absent
    events: pd.DataFrame  # rank, time_us, kind, and the event's other fields
    heartbeats: pd.DataFrame  # rank and the heartbeat.json keys
    skipped: list[Skipped] = field(default_factory=list)
    world_size: int | None = None
    ranks_found: list[int] = field(default_factory=list)
    ranks_missing: list[int] = field(default_factory=list)
    run_id: str | None = None
    # torch.profiler (Kineto) imports only (diag.trace.kineto): every GPU activity with its device interval,
    # kind and step; None for diag's own traces
    gpu_kernels: pd.DataFrame | None = None
    nccl_logs: dict[int, NcclLog] = field(default_factory=dict)  # NCCL's own log by rank, where nccl.log exists
    memory_deep: dict[int, dict] = field(default_factory=dict)  # memory_deep.json by rank, where the mode ran
    # rank -> the time before which its rows belong to an earlier run appended to the same files (dropped): for
    # tables read later, rank by rank (diag.analysis.partitioned)
    earlier_run_cuts_us: dict[int, float] = field(default_factory=dict)
    # (table, column) of the columns a load of only some columns left out that hold a value on some rank: for
    # analyses that read them later, rank by rank (diag.analysis.partitioned); None: not known
    left_out_values: frozenset[tuple[str, str]] | None = None

    def manifest(self, rank: int) -> Manifest | None:
        return self.manifests.get(rank)

    def first_manifest_value(self, name: str):
        """The lowest rank's value of a manifest field every rank of a run shares (launcher, job, device name)."""
        return first_of(self.manifests, name)

    def clock_offsets_us(self) -> dict[int, float]:
        """Each rank's clock minus rank 0's, measured at init (manifest ``clock_offset_us``); subtract it from a
        rank's wall-clock times to put them on rank 0's clock. Ranks without a measurement are absent."""
        return {r: m.clock_offset_us for r, m in self.manifests.items() if m.clock_offset_us is not None}


def empty_table(table: Table) -> pd.DataFrame:
    frame = pd.DataFrame({"rank": pd.Series(dtype="int32")})
    for column in table.columns:
        frame[column.name] = pd.Series(dtype=column.dtype)
    return frame


@dataclass
class ArrowChunk:
    """The rows of one file as an Arrow table (None when there are none), before conversion to pandas."""

    table: pa.Table | None
    next_offset: int
    skipped: list[Skipped]
    columns: int | None = None  # how many of the table's columns the file holds (from its header)


def read_table_arrow(path: Path, table: Table, offset: int = 0, columns: int | None = None) -> ArrowChunk:
    """Parse the complete rows of ``path`` from byte ``offset`` on (0: the whole file, header checked), left in
    Arrow: converting thousands of small files to pandas one by one costs more than parsing them, so
    ``TraceReader`` converts each table once, after concatenating. ``columns``: how many leading columns the
    file holds, as its header said when it was first read (a file written before a column was added has
    fewer); the missing ones are added empty."""
    columns = len(table.columns) if columns is None else columns
    try:
        data = read_file_bytes(path, offset)
    except OSError as exc:
        return ArrowChunk(None, offset, [Skipped(str(path), f"unreadable: {exc}")])
    end = data.rfind(b"\n") + 1  # a last line without newline is still being written
    skipped: list[Skipped] = []
    start = 0
    if offset == 0:
        first = data.find(b"\n", 0, end)
        header_start = end if first < 0 else first + 1
        second = data.find(b"\n", header_start, end)
        start = end if second < 0 else second + 1
        marker, header = data[: end if first < 0 else first], data[header_start : end if second < 0 else second]
        parsed = parse_marker(marker.decode("utf-8", "replace"))
        if parsed is None:
            return _rejected(path, end, "not a diag trace file (no marker line)")
        version, name = parsed
        if version != CSV_SCHEMA_VERSION:
            return _rejected(
                path, end, f"schema version {version}, this diag reads CSV tables of version {CSV_SCHEMA_VERSION}"
            )
        columns = table.header_columns(header.decode("utf-8", "replace").split(",")) if name == table.name else None
        if columns is None:
            return _rejected(path, end, f"header does not match table {table.name!r}")
    arrow, bad = _parse_rows(data, start, end, table.leading(columns))
    if bad:
        skipped.append(Skipped(str(path), "corrupt rows skipped", bad))
    return ArrowChunk(_with_later_columns(arrow, table), offset + end, skipped, columns)


def _with_later_columns(arrow: pa.Table | None, table: Table) -> pa.Table | None:
    """Rows of a file written before some columns were added, with those columns empty."""
    if arrow is None or arrow.num_columns == len(table.columns):
        return arrow
    for column in table.columns[arrow.num_columns :]:
        arrow = arrow.append_column(column.name, pa.nulls(arrow.num_rows, _ARROW_TYPES[column.dtype]))
    return arrow


def _rejected(path: Path, end: int, reason: str) -> ArrowChunk:
    return ArrowChunk(None, end, [Skipped(str(path), reason)])


def _arrow_schema(table: Table) -> pa.Schema:
    return pa.schema([(c.name, _ARROW_TYPES[c.dtype]) for c in table.columns])


def _parse_rows(data: bytes, start: int, end: int, table: Table) -> tuple[pa.Table | None, int]:
    """Rows of ``data[start:end]``, parsed in place (a file's rows are not copied), and how many were lost."""
    if end <= start or (end - start < 4096 and not data[start:end].strip()):
        return None, 0
    lines = data.count(b"\n", start, end)
    if data.find(b'"', start, end) >= 0:
        # quoted names (a comma or quote in a phase name): a line with an unbalanced quote is corrupt, and would
        # make the CSV parser swallow the rows after it; the writer never breaks a line inside a value
        data = _without_unbalanced_quotes(data[start:end])
        start, end = 0, len(data)
    if not data.isascii() and not _is_utf8(memoryview(data)[start:end]):
        # pyarrow's bad-row handler cannot even decode such a row (it prints a traceback with the bytes)
        arrow = _parse_lenient(data[start:end], table)
        return arrow, lines - arrow.num_rows
    rows = pa.py_buffer(memoryview(data)[start:end])
    try:
        arrow = _finite_floats(_parse_typed(rows, table), table)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # garbage somewhere (text in a number, 1.5 or inf or 20 digits in an integer, non-UTF-8, binary junk):
        # the slow path checks line by line and keeps only the rows that are entirely sane
        try:
            arrow = _parse_lenient_arrow(rows, table)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            arrow = _parse_lenient(data[start:end], table)
    return arrow, lines - arrow.num_rows


def _without_unbalanced_quotes(rows: bytes) -> bytes:
    """The lines of ``rows`` whose '"' are balanced (an even count); the caller counts the others as lost."""
    kept = [line for line in rows.split(b"\n") if line.count(b'"') % 2 == 0]
    return b"\n".join(kept)


def _is_utf8(data: memoryview) -> bool:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _finite_floats(arrow: pa.Table, table: Table) -> pa.Table:
    """inf and nan in a float column become null (unknown), not numbers that poison every mean."""
    for i, column in enumerate(table.columns):
        if column.dtype != "Float64":
            continue
        values = arrow.column(i)
        finite = pc.is_finite(values)  # null where the value is null, which all() skips
        if pc.all(finite).as_py() is False:
            arrow = arrow.set_column(i, column.name, pc.if_else(finite, values, pa.scalar(None, pa.float64())))
    return arrow


_INT_RANGES = {"int64": (-(2**63) + 1024, 2**63 - 1024), "Int64": (-(2**63) + 1024, 2**63 - 1024), "int8": (-128, 127)}


def _csv_options(table: Table, types: dict):
    bad_rows = []
    read = pacsv.ReadOptions(column_names=table.column_names, use_threads=True, block_size=1 << 22)
    parse = pacsv.ParseOptions(
        invalid_row_handler=lambda row: bad_rows.append(row) or "skip",
        # the writer quotes names holding a comma or quote, and never writes a line break inside a value (it
        # escapes it), so a quoted field cannot span lines: a stray '"' spoils its own row only, skipped
        newlines_in_values=False,
        quote_char='"',
        double_quote=True,
    )
    convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=True)
    return read, parse, convert


def _required(table: Table) -> list[str]:
    return [c.name for c in table.columns if c.dtype in ("int64", "int8")]


def _drop_incomplete(arrow: pa.Table, table: Table) -> pa.Table:
    """Rows with an empty required (non-nullable) field are corrupt."""
    required = _required(table)
    if not any(arrow.column(name).null_count for name in required):
        return arrow
    valid = pc.is_valid(arrow.column(required[0]))
    for name in required[1:]:
        valid = pc.and_(valid, pc.is_valid(arrow.column(name)))
    return arrow.filter(valid)


def _parse_typed(rows: pa.Buffer, table: Table) -> pa.Table:
    types = {c.name: _ARROW_TYPES[c.dtype] for c in table.columns}
    return _drop_incomplete(pacsv.read_csv(pa.BufferReader(rows), *_csv_options(table, types)), table)


_NUMBER_PATTERNS = {
    "int64": r"^-?[0-9]{1,18}$",  # 18 digits always fit int64
    "Int64": r"^-?[0-9]{1,18}$",
    "int8": r"^-?[0-9]{1,3}$",
    "Float64": r"^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$",  # finite: no inf or nan
}


def _parse_lenient_arrow(rows: pa.Buffer, table: Table) -> pa.Table:
    """Middle path (valid UTF-8, a bad value somewhere): pyarrow reads every column as text, rows whose numbers
    do not match their column's pattern are dropped, the rest cast, all in pyarrow's C++ (a 2M-row file with
    one bad row costs seconds, not minutes)."""
    types = {c.name: pa.string() for c in table.columns}
    arrow = pacsv.read_csv(pa.BufferReader(rows), *_csv_options(table, types))
    keep = pa.array(np.ones(arrow.num_rows, dtype=bool))
    for column in table.columns:
        if column.dtype == "category":
            continue
        matches = pc.match_substring_regex(arrow.column(column.name), _NUMBER_PATTERNS[column.dtype])
        keep = pc.and_(keep, matches.fill_null(column.dtype not in ("int64", "int8")))
    arrow = arrow.filter(keep)
    arrays = []
    for column in table.columns:
        values = arrow.column(column.name)
        if column.dtype == "category":
            arrays.append(values.dictionary_encode())
        elif column.dtype == "int8":
            wide = pc.cast(values, pa.int64())
            arrays.append(wide)
        else:
            arrays.append(pc.cast(values, _ARROW_TYPES[column.dtype]))
    wide = pa.Table.from_arrays(arrays, names=table.column_names)
    for column in table.columns:
        if column.dtype == "int8":
            values = wide.column(column.name)
            wide = wide.filter(pc.and_(pc.greater_equal(values, -128), pc.less_equal(values, 127)))
    return wide.cast(_arrow_schema(table))


def _parse_lenient(data: bytes, table: Table) -> pa.Table:
    """Slow path for a damaged file, line by line: a row is kept only if it is valid UTF-8 with the right number
    of fields and every number converts to its column's type (integers integral and in range, floats finite;
    a bad optional value becomes null). Everything else is counted as lost by the caller, never fatal."""
    names = table.column_names
    good = []
    for line in data.split(b"\n"):
        try:
            fields = next(csv.reader([line.decode("utf-8").rstrip("\r")]), [])
        except (UnicodeDecodeError, csv.Error):
            continue
        if len(fields) == len(names):
            good.append([f if f else None for f in fields])
    frame = pd.DataFrame(good, columns=names, dtype=object)
    for column in table.columns:
        if column.dtype != "category":
            frame[column.name] = _sane_numbers(frame[column.name], column.dtype)
    return _to_arrow(frame.dropna(subset=_required(table)), table)


def _to_arrow(frame: pd.DataFrame, table: Table) -> pa.Table:
    arrays = []
    for column in table.columns:
        values = frame[column.name]
        if column.dtype == "category":
            arrays.append(pa.array(values.astype(object).where(values.notna(), None), pa.string()).dictionary_encode())
        else:
            arrays.append(
                pa.array(values.to_numpy(dtype="float64"), mask=values.isna().to_numpy()).cast(
                    _ARROW_TYPES[column.dtype]
                )
            )
    return pa.Table.from_arrays(arrays, schema=_arrow_schema(table))


def _sane_numbers(values: pd.Series, dtype: str) -> pd.Series:
    """Numbers as float64 with NaN for anything that does not fit ``dtype`` (text, inf, 1.5 in an int, 20 digits)."""
    numbers = pd.to_numeric(values, errors="coerce").astype("float64")
    sane = np.isfinite(numbers)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        sane &= (numbers == np.floor(numbers)) & (numbers >= low) & (numbers <= high)
    return numbers.where(sane)


_NULLABLE_DTYPES = {"Int64": pd.Int64Dtype(), "Float64": pd.Float64Dtype()}


def to_frame(parts: list[pa.Table], table: Table, rank_column: bool = False) -> pd.DataFrame:
    """One pandas frame, with the schema's dtypes, from Arrow tables of one table (all from the same schema).

    The parts are concatenated once (no copy) and converted column by column straight to the schema's dtypes:
    nullable integers and floats through ``types_mapper`` (Arrow's validity bitmap becomes the mask; converting
    to float64 with NaN, then ``astype("Int64")``, scanned every value again: a third of a cold load), dictionary
    columns to categoricals (the ranks' dictionaries unified in the conversion). ``Table.to_pandas`` of the
    whole table also rebuilt pandas' metadata and consolidated blocks. ``parts`` is emptied: each column's
    Arrow buffers are freed once converted."""
    if not parts:
        frame = empty_table(table)
        return frame if rank_column else frame[table.column_names]
    arrow = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    parts.clear()
    dtypes = {"rank": "int32", **table.dtypes}
    columns = {}
    for name in arrow.column_names:
        nullable = _NULLABLE_DTYPES.get(dtypes.get(name, ""))
        mapper = (lambda _type, dtype=nullable: dtype) if nullable is not None else None
        columns[name] = arrow.column(name).to_pandas(types_mapper=mapper)
        arrow = arrow.drop_columns([name])  # its buffers are freed now, not after the last column
    del arrow
    frame = pd.DataFrame(columns, copy=False)
    for name, dtype in dtypes.items():
        if name in frame and str(frame[name].dtype) != dtype:
            frame[name] = frame[name].astype(dtype)
    return frame


def read_json(path: Path, skipped: list[Skipped]) -> dict | None:
    try:
        value = load_json_limited(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        skipped.append(Skipped(str(path), f"unreadable JSON: {exc}"))
        return None
    if not isinstance(value, dict):
        skipped.append(Skipped(str(path), "not a JSON object"))
        return None
    return value


# events.jsonl rows: the fields capture writes (diag/trace/writer.py ``event``: time_us and kind, then each kind's
# own) and the check each value gets where it is read; a value that fails it is left out of its row.
EVENT_FIELDS: dict[str, Callable] = {
    "time_us": json_values.time_us,
    "start_us": json_values.time_us,
    "end_us": json_values.time_us,
    "step": json_values.int64,
    "seq": json_values.int64,
    "peer": json_values.int64,
    **dict.fromkeys(
        ("error", "message", "op", "pg", "reason", "file", "phase", "value_name", "value", "summary_file"),
        json_values.text,
    ),  # fmt: skip
    **dict.fromkeys(
        (
            "allocated_bytes",
            "reserved_bytes",
            "inactive_split_bytes",
            "alloc_retries",
            "ooms",
            "param_bytes",
            "grad_bytes",
            "optimizer_state_bytes",
        ),
        json_values.finite,
    ),  # fmt: skip
}
EXTRA_EVENT_FIELD = "extra"  # the other fields of a row, collapsed into one: a column per key would follow the input
MAX_EXTRA_EVENT_KEYS = 32  # per row: more is not something capture wrote


def checked_event(event: dict) -> tuple[dict | None, int]:
    """An events.jsonl row with each known field checked (a value of the wrong type or out of range left out)
    and its other fields collapsed into ``extra`` (scalars only, at most MAX_EXTRA_EVENT_KEYS); None without a
    kind. Also the count of values left out."""
    kind = json_values.text(event.get("kind"))
    if kind is None or isinstance(event.get("kind"), int | float):
        return None, 0
    row: dict = {"kind": kind}
    extra: dict = {}
    dropped = 0
    for key, value in event.items():
        if key in ("kind", "rank"):  # the rank is the directory's
            continue
        check = EVENT_FIELDS.get(key)
        if check is not None:
            checked = check(value) if value is not None else None
            dropped += value is not None and checked is None
            row[key] = checked
        elif len(extra) < MAX_EXTRA_EVENT_KEYS and isinstance(key, str) and len(key) <= 128:
            checked = json_values.scalar(value)
            dropped += value is not None and checked is None
            if checked is not None:
                extra[key] = checked
        else:
            dropped += 1
    if extra:
        row[EXTRA_EVENT_FIELD] = extra
    return row, dropped


def _read_events(path: Path, offset: int, skipped: list[Skipped]) -> tuple[list[dict], int]:
    try:
        data = read_file_bytes(path, offset)
    except FileNotFoundError:
        return [], offset
    except OSError as exc:
        skipped.append(Skipped(str(path), f"unreadable: {exc}"))
        return [], offset
    end = data.rfind(b"\n") + 1
    events, bad, values_dropped = [], 0, 0
    for line in data[:end].splitlines():
        try:
            if not json_depth_ok(line):
                raise ValueError("nested too deep")
            event = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        row, dropped = checked_event(event) if isinstance(event, dict) else (None, 0)
        if row is None:
            bad += 1
            continue
        events.append(row)
        values_dropped += dropped
    if bad:
        skipped.append(Skipped(str(path), "corrupt events skipped", bad))
    if values_dropped:
        reason = f"{values_dropped} event values of the wrong type or out of range, or beyond the first "
        skipped.append(Skipped(str(path), reason + f"{MAX_EXTRA_EVENT_KEYS} other fields of a row, left out"))
    return events, offset + end


def read_nccl_log(path: Path, skipped: list[Skipped]) -> NcclLog | None:
    """The parsed nccl.log of a rank directory (its first MAX_NCCL_LOG_BYTES), None when there is none. Lines not
    understood are counted in ``skipped``."""
    try:
        data = read_file_bytes(path, max_bytes=MAX_NCCL_LOG_BYTES, head=True)
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        skipped.append(Skipped(str(path), f"unreadable: {exc}"))
        return None
    log = parse_text(data.decode("utf-8", "replace"))
    if size > MAX_NCCL_LOG_BYTES:
        skipped.append(Skipped(str(path), f"{size} bytes: only the first {MAX_NCCL_LOG_BYTES} read"))
    if log.lines_skipped:
        skipped.append(
            Skipped(str(path), "NCCL log lines not understood (cut short, run together, not NCCL's)", log.lines_skipped)
        )
    return log


def find_rank_dirs(root: Path, skipped: list[Skipped] | None = None) -> dict[int, Path]:
    """``rankN`` sub-directories by rank. Two spellings of one rank (rank00001 and rank1) keep the canonical
    five-digit one; a rank above MAX_RANK is not a real job's; both are named in ``skipped`` when given."""
    ranks: dict[int, Path] = {}
    notes: list[Skipped] = []
    # by name: the order of sorting the paths themselves (one parent), without pathlib's comparisons (~1 s at
    # 16,384 ranks, and the partitioned analysis lists the directory several times)
    for child in sorted(root.iterdir(), key=lambda p: p.name) if root.is_dir() else ():
        match = RANK_DIR_RE.match(child.name)
        if not match or not child.is_dir():
            continue
        rank = int(match.group(1)) if len(match.group(1)) < 19 else MAX_RANK + 1
        if rank > MAX_RANK:
            notes.append(Skipped(str(child), f"rank number above {MAX_RANK}: not read"))
            continue
        if rank in ranks:
            keep, drop = sorted([ranks[rank], child], key=lambda p: (p.name != f"rank{rank:05d}", p.name))
            notes.append(Skipped(str(drop), f"a second directory for rank {rank} (besides {keep.name}): not read"))
            child = keep
        ranks[rank] = child
    if skipped is not None:
        skipped.extend(notes)
    return dict(sorted(ranks.items()))


def gather_rank_reads(reads, table_names, skipped: list, progress=None, frames: bool = True) -> tuple[dict, dict]:
    """Per-rank reads ``(rank, RankRead)``, in rank order, gathered: each table's Arrow chunks, and
    ``TraceReader.poll``'s other entries (manifests as their JSON objects, which assemble_trace parses;
    heartbeats and events as frames, or ``frames=False`` lists of records; what was skipped, after ``skipped``;
    every rank's NCCL log, not only what changed: a log is parsed whole)."""
    chunks: dict[str, list[pa.Table]] = {name: [] for name in table_names}
    manifests, heartbeats, events, nccl_logs = [], [], [], {}
    for rank, read in reads:
        if read.nccl_log is not None:
            nccl_logs[rank] = read.nccl_log
        if read.manifest is not None:
            manifests.append(read.manifest)
        if read.heartbeat is not None:
            heartbeats.append(read.heartbeat)
        for name, arrow in read.tables.items():
            chunks[name].append(arrow)
        events.extend(read.events)
        skipped.extend(read.skipped)
        if progress is not None:
            progress(1)
    side = {
        "manifests": manifests,
        "heartbeats": pd.DataFrame(heartbeats) if frames else heartbeats,
        "events": pd.DataFrame(events) if frames else events,
        "skipped": skipped,
        "nccl_logs": nccl_logs,
    }
    return chunks, side


# What reading one file can raise besides the reader's own checks: no access (a rank directory at mode 000),
# or damage a format library finds first (pyarrow's checks of a crafted segment)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException)


@dataclass(frozen=True)
class RankRead:
    """What ``TraceReader.read_rank`` read of one rank directory: what is new since the reader's last read of it."""

    manifest: dict | None  # manifest.json with the rank added; None: none, or unreadable (said in ``skipped``)
    heartbeat: dict | None  # heartbeat.json likewise
    tables: dict[str, pa.Table]  # new rows by table, with a rank column; tables without new rows left out
    events: list[dict]  # new events.jsonl rows, with the rank
    skipped: list[Skipped]
    nccl_log: NcclLog | None  # nccl.log parsed whole (not only what was appended); None without one


class TraceReader:
    """Incremental reader of a trace directory: each ``poll()`` reads only what was appended since, rank by
    rank (``read_rank``). ``segment_columns``: per table, the only columns decoded of its schema-2 segments
    (the others read as nulls: nullable ones only)."""

    def __init__(self, path: str | Path, tables: tuple[str, ...] = tuple(TABLES), segment_columns: dict | None = None):
        self.path = Path(path)
        self.tables = tables
        self.segment_columns = segment_columns or {}
        self._offsets: dict[Path, int] = {}
        self._rejected: set[Path] = set()
        self._columns: dict[Path, int] = {}  # columns each table file holds, from its header (older files: fewer)
        self._dir_notes: list[Skipped] = []
        self._noted: set[str] = set()
        self._nccl: dict[Path, tuple[tuple[int, int], NcclLog | None]] = {}  # read again only when it changed
        self._segments: dict[tuple[Path, str], TableSegments] = {}  # schema version 2: what was read of each table
        # table -> (column, low, high): a windowed one-off read of schema-2 segments (TableSegments.window; diag export)
        self.windows: dict[str, tuple[str, float, float]] = {}

    def rank_dirs(self) -> dict[int, Path]:
        if not self.path.exists():
            raise TraceError(f"{self.path} does not exist")
        if not self.path.is_dir():
            raise TraceError(f"{self.path} is not a directory; give the trace directory diag.init wrote")
        skipped: list[Skipped] = []
        found = find_rank_dirs(self.path, skipped)
        self._dir_notes = skipped
        return found

    def dir_notes(self, once: bool = False) -> list[Skipped]:
        """What the last ``rank_dirs()`` left out (a second directory for a rank, a rank number too high).
        ``once``: those not given before by such a call (said once, not at every poll of a live view)."""
        notes = [s for s in self._dir_notes if not (once and s.path in self._noted)]
        if once:
            self._noted.update(s.path for s in notes)
        return notes

    def read_state(self) -> dict:
        """What this reader has read of each file (offsets, segments, rejected files, parsed NCCL logs): another
        reader of the same directory that ``merge_read_state``s it reads on from there. Worker processes that
        read shares of the ranks send theirs back this way (diag.analysis.partitioned.poll_in_workers)."""
        return {"offsets": self._offsets, "rejected": self._rejected, "columns": self._columns, "nccl": self._nccl,
                "segments": self._segments}  # fmt: skip

    def merge_read_state(self, state: dict) -> None:
        """Take on ``read_state()`` of a reader that read other ranks of this directory."""
        self._offsets.update(state["offsets"])
        self._rejected.update(state["rejected"])
        self._columns.update(state["columns"])
        self._nccl.update(state["nccl"])
        self._segments.update(state["segments"])

    def poll(self, progress=None) -> dict:
        """New rows per table, plus manifests, heartbeats, events and what was skipped in this read.

        Ranks are read by a few threads (pyarrow parses without holding the GIL); rows stay in Arrow until
        each table is converted to pandas once."""
        rank_dirs = self.rank_dirs()
        skipped = self.dir_notes(once=True)
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            reads = zip(rank_dirs, pool.map(lambda item: self.read_rank(*item), rank_dirs.items()))
            chunks, side = gather_rank_reads(reads, self.tables, skipped, progress)
        result = {}
        for name in self.tables:
            result[name] = self.frame(name, chunks[name])
            chunks[name] = []  # free the Arrow copy before converting the next table
        return {**result, **side, "ranks": list(rank_dirs)}

    def frame(self, name: str, chunks: list[pa.Table]) -> pd.DataFrame:
        """One table of every rank read, as pandas (a subclass may keep fewer columns: diag.analysis.partitioned)."""
        return to_frame(chunks, TABLES[name], rank_column=True)

    def read_rank(self, rank: int, rank_dir: Path) -> RankRead:
        """What is new in one rank directory since this reader last read it: rows of the reader's tables,
        manifest, heartbeat, events, NCCL log, and what was skipped. A new reader reads from the beginning."""
        skipped: list[Skipped] = []
        try:
            os.listdir(rank_dir)
        except OSError as exc:  # at mode 000 (another user's): one note for the directory, not one per file
            self._note_unreadable(rank_dir, exc, skipped)
            return RankRead(None, None, {}, [], skipped, None)
        manifest = read_json(rank_dir / MANIFEST_FILE, skipped)
        # checked as it is read: a value of the wrong type (a list for last_step) reads as unknown
        heartbeat = Heartbeat.from_json(read_json(rank_dir / HEARTBEAT_FILE, skipped))
        tables = self.read_rank_tables(rank, rank_dir, self.tables, skipped)
        events_path = rank_dir / EVENTS_FILE
        new_events, self._offsets[events_path] = _read_events(events_path, self._offsets.get(events_path, 0), skipped)
        return RankRead(
            None if manifest is None else {**manifest, "rank": rank},
            None if heartbeat is None else {**heartbeat.to_json(), "rank": rank},
            tables,
            [{**e, "rank": rank} for e in new_events],
            skipped,
            self._read_nccl_log(rank_dir / NCCL_LOG_FILE, skipped),
        )

    def read_rank_tables(
        self, rank: int, rank_dir: Path, names: tuple[str, ...], skipped: list[Skipped], files: list[str] | None = None
    ) -> dict[str, pa.Table]:
        """New rows of the tables ``names`` of one rank, with its rank column (tables without rows left out).
        ``files``: the rank directory's listing, when the caller has it (diag.analysis.partitioned reads a
        rank's tables in two groups from one listing)."""
        files = _listing(rank_dir, skipped) if files is None else files
        tables = {}
        for name in names:
            try:
                arrow = self._read_new_rows(rank_dir / TABLES[name].file_name, TABLES[name], skipped)
                arrow = _concat(arrow, self._read_new_segments(rank_dir, files, TABLES[name], skipped))
            except UNREADABLE as exc:  # one table of one rank: named, and the others still read (a live view too)
                self._note_unreadable(rank_dir / TABLES[name].file_name, exc, skipped)
                continue
            if arrow is not None and arrow.num_rows:
                tables[name] = arrow.add_column(0, "rank", pa.array(np.full(arrow.num_rows, rank, dtype="int32")))
        return tables

    def _note_unreadable(self, path: Path, exc: BaseException, skipped: list[Skipped]) -> None:
        """Said once per file, not at every poll of a live view (the file is tried again: it may be fixed)."""
        key = f"{path}: {type(exc).__name__}"
        if key not in self._noted:
            self._noted.add(key)
            skipped.append(Skipped(str(path), f"unreadable, left out: {type(exc).__name__}: {str(exc)[:200]}"))

    def _read_nccl_log(self, path: Path, skipped: list[Skipped]) -> NcclLog | None:
        """nccl.log parsed, again only when its size or time changed (NCCL appends while a live view polls)."""
        try:
            info = path.stat()
        except OSError:
            return None
        key = (info.st_size, info.st_mtime_ns)
        known = self._nccl.get(path)
        if known is not None and known[0] == key:
            return known[1]
        log = read_nccl_log(path, skipped)
        self._nccl[path] = (key, log)
        return log

    def _read_new_segments(
        self, rank_dir: Path, names: list[str], table: Table, skipped: list[Skipped], segments=None, tail_rows=None
    ):
        """Schema version 2: rows appended to the table's segments since the last poll (diag/trace/columnar.py),
        checked as CSV rows are (finite floats; rows without a required value dropped and counted). ``segments``
        and ``tail_rows``: a one-off read (``read_segments_tail``)."""
        if not any(n.startswith(table.name + ".") and n.endswith((".arrows", ".parquet")) for n in names):
            return None
        key = (rank_dir, table.name)
        segments = self._segments.get(key) if segments is None else segments
        if segments is None:
            window, columns = self.windows.get(table.name), self.segment_columns.get(table.name)
            segments = self._segments[key] = TableSegments(table, window=window, columns=columns)
        notes = []
        arrow = segments.read_new(rank_dir, names, notes, tail_rows)
        skipped.extend(Skipped(n.path, n.reason, n.rows) for n in notes)
        if arrow is None:
            return None
        checked = _drop_incomplete(_finite_floats(arrow, table), table)
        if checked.num_rows < arrow.num_rows:
            skipped.append(
                Skipped(
                    str(rank_dir),
                    f"{table.name}: rows without a required value skipped",
                    arrow.num_rows - checked.num_rows,
                )
            )
        return checked

    def read_segments_tail(
        self, rank_dir: Path, names: list[str], table: Table, rows: int, skipped: list[Skipped], columns=None
    ) -> tuple[pa.Table | None, bool]:
        """The last rows of the table's schema-2 segments, ``rows`` of them or a few more (``names``: the listing
        of ``rank_dir``), read once from the newest back, checked as every read is, decoding only ``columns`` (as
        ``segment_columns``); and whether earlier rows were left unread (``TableSegments.read_new``'s tail_rows)."""
        segments = TableSegments(table, columns=columns)
        return self._read_new_segments(rank_dir, names, table, skipped, segments, rows), segments.cut

    def read_table_file(self, path: Path, table: Table, offset: int = 0, columns: int | None = None) -> ArrowChunk:
        """The complete rows of a version-1 table file from byte ``offset`` (0: the whole file, its header
        checked; past 0, ``columns``: how many columns its header names), read once: where the read ended is
        the caller's to keep. A file that is not a regular one, or not this table's, is not read again."""
        if path in self._rejected or not path.exists():
            return ArrowChunk(None, offset, [])
        try:
            info = path.stat()
        except OSError:
            return ArrowChunk(None, offset, [])
        if not stat.S_ISREG(info.st_mode):  # a FIFO or /dev/zero under a table's name: never read
            self._rejected.add(path)
            return ArrowChunk(None, offset, [Skipped(str(path), "not a regular file: not read")])
        if info.st_size <= offset:
            return ArrowChunk(None, offset, [])
        chunk = read_table_arrow(path, table, offset, columns)
        header_bad = any("schema" in s.reason or "header" in s.reason or "marker" in s.reason for s in chunk.skipped)
        if offset == 0 and chunk.table is None and chunk.next_offset > 0 and header_bad:
            self._rejected.add(path)
        return chunk

    def _read_new_rows(self, path: Path, table: Table, skipped: list[Skipped]) -> pa.Table | None:
        offset = self._offsets.get(path, 0)
        chunk = self.read_table_file(path, table, offset, self._columns.get(path))
        if chunk.columns is not None:
            self._columns[path] = chunk.columns
        skipped.extend(chunk.skipped)
        if chunk.next_offset != offset:
            self._offsets[path] = chunk.next_offset
        return chunk.table


def _listing(rank_dir: Path, skipped: list[Skipped]) -> list[str]:
    try:
        return os.listdir(rank_dir)
    except OSError as exc:
        skipped.append(Skipped(str(rank_dir), f"unreadable directory: {exc}"))
        return []


def _concat(first: pa.Table | None, second: pa.Table | None) -> pa.Table | None:
    """A rank's CSV rows (an earlier run written as version 1) then its segments' rows."""
    if first is None or not first.num_rows:
        return second
    if second is None or not second.num_rows:
        return first
    return pa.concat_tables([first, second]).unify_dictionaries()


def load(path: str | Path, progress: bool = False) -> Trace:
    """Load every rank of the trace directory ``path``. Raises TraceError only when nothing is usable."""
    reader = TraceReader(path)
    rank_dirs = reader.rank_dirs()
    if not rank_dirs:
        raise TraceError(
            f"no diag traces in {path}: expected rank00000/, rank00001/, ... sub-directories written by diag.init"
        )
    bar = progress_bar(len(rank_dirs), "loading ranks") if progress else NoBar()
    try:
        data = reader.poll(progress=bar.update)
    finally:
        bar.close()
    return assemble_trace(Path(path), data)


def assemble_trace(path: Path, data: dict, latest_run_only: bool = True) -> Trace:
    """A Trace from what ``TraceReader.poll`` read: keeps one run, finds missing ranks, lists what was skipped.
    ``latest_run_only=False`` keeps a rank's earlier runs appended to the same files (triage judges a failed
    attempt that a restart into the same directory followed)."""
    skipped: list[Skipped] = data["skipped"]
    ranks = data["ranks"]
    run_ids = pd.Series([r.get("run_id") for r in data["manifests"]], dtype="object")
    counts = run_ids[run_ids.map(lambda v: isinstance(v, str) and v != "")].value_counts()
    run_id = counts.index[0] if len(counts) else None  # several: keep the run with the most ranks here
    if len(counts) > 1:
        others = [r["rank"] for r in data["manifests"] if r.get("run_id") != run_id]
        skipped.append(
            Skipped(
                str(path), f"ranks {others} belong to other runs ({', '.join(map(str, counts.index[1:]))}); left out"
            )
        )
        data = _drop_ranks(data, set(others))
        ranks = [r for r in ranks if r not in set(others)]
    data = _drop_insane_durations(data, skipped, path)
    if latest_run_only:
        data = _latest_run_only(data, skipped, path)
    manifests, world_size = checked_manifests(data["manifests"], ranks, skipped, path)
    missing = sorted(set(range(world_size or 0)) - set(ranks))
    return Trace(
        path=path,
        steps=data["steps"],
        phases=data["phases"],
        collectives=data["collectives"],
        memory=data["memory"],
        telemetry=data["telemetry"],
        microbatches=data["microbatches"],
        # a reader of only some tables (the dashboard's live one, perfetto's) may not have read it
        calibration=data.get("calibration", empty_table(TABLES["calibration"])),
        manifests=manifests,
        events=data["events"],
        heartbeats=data["heartbeats"],
        skipped=skipped,
        world_size=world_size,
        ranks_found=list(ranks),
        ranks_missing=missing,
        run_id=run_id,
        nccl_logs=data.get("nccl_logs", {}),
        memory_deep=read_memory_deep(path, list(ranks), skipped),
        earlier_run_cuts_us=data.get("earlier_run_cuts_us", {}),
        left_out_values=data.get("left_out_values"),
    )


MAX_DURATION_US = 7 * 24 * 3600 * 1_000_000  # a step, span or collective longer than a week is a damaged row


def checked_manifests(
    raw: list[dict], ranks: list[int], skipped: list[Skipped], path: Path
) -> tuple[dict[int, Manifest], int | None]:
    """(the ranks' parsed manifests, the world size), the parser's notes and the ranks without a manifest named
    in ``skipped`` (as a trace of ``ranks`` has them)."""
    notes: list[str] = []
    manifests = parse_manifests(raw, notes)
    skipped.extend(Skipped(str(path), note) for note in notes)
    world_size = _world_size(manifests, ranks, skipped, path)
    without_manifest = sorted(set(ranks) - set(manifests))
    if without_manifest:
        skipped.append(
            Skipped(str(path), f"ranks {without_manifest} have no readable manifest.json; their rows are kept")
        )
    return manifests, world_size


def insane_durations(duration_us: np.ndarray) -> np.ndarray:
    """The rows to drop: a negative duration, or one over MAX_DURATION_US (typically start and duration swapped:
    "costs the job 1795514172969.3 ms/step"); NaN (an unfinished collective) is kept."""
    with np.errstate(invalid="ignore"):
        return (duration_us < 0) | (duration_us > MAX_DURATION_US)


INSANE_REASON = "rows with a negative duration or one over 7 days"


def insane_durations_note(table: str, rows: int, path: Path) -> Skipped:
    return Skipped(str(path), f"{table}: {INSANE_REASON} (start and duration swapped?) dropped", rows)


@dataclass
class Dropped:
    """Rows the cleaning of ranks' tables dropped: by table, those with an impossible duration; those of an
    earlier run appended to the same files. Ranks cleaned one by one add up (``+``) to what one load drops."""

    insane_rows: dict[str, int] = field(default_factory=dict)
    earlier_run_rows: int = 0

    def __add__(self, other: Dropped) -> Dropped:
        insane = dict(self.insane_rows)
        for name, rows in other.insane_rows.items():
            insane[name] = insane.get(name, 0) + rows
        return Dropped(insane, self.earlier_run_rows + other.earlier_run_rows)

    def insane_notes(self, path: Path) -> list[Skipped]:
        """A note per table of its rows with an impossible duration, in schema order (as a load lists them)."""
        return [
            insane_durations_note(name, self.insane_rows[name], path) for name in TABLES if name in self.insane_rows
        ]


CLEANING_COLUMNS = ("start_us", "duration_us", "time_us")  # what clean_rank_tables reads: a narrowed read keeps them


def clean_rank_tables(tables: dict[str, pa.Table], cut_us: float | None = None) -> tuple[dict[str, pa.Table], Dropped]:
    """One rank's tables as read (Arrow), cleaned as ``load`` cleans a trace: rows with an impossible duration
    dropped, then, with ``cut_us`` (the rank's ``Trace.earlier_run_cuts_us``), rows stamped before it: an
    earlier run appended to the same files. A table left without rows is left out, as ``read_rank_tables``
    leaves it. Readers of single ranks (the analysis engine, the Perfetto export) clean with it, so that every
    path drops the rows a load drops."""
    dropped = Dropped()
    cleaned = {}
    for name, arrow in tables.items():
        keep = np.ones(arrow.num_rows, dtype=bool)
        if "duration_us" in arrow.column_names:  # nulls (unfinished collectives) become NaN, which are kept
            insane = insane_durations(arrow.column("duration_us").to_numpy(zero_copy_only=False).astype("float64"))
            if insane.any():
                dropped.insane_rows[name] = int(insane.sum())
                keep &= ~insane
        stamp = _stamp_column(arrow.column_names)
        if cut_us is not None and stamp is not None:
            earlier = keep & (arrow.column(stamp).to_numpy(zero_copy_only=False).astype("float64") < cut_us)
            dropped.earlier_run_rows += int(earlier.sum())
            keep &= ~earlier
        if keep.all():
            cleaned[name] = arrow
        elif keep.any():  # as read_rank_tables gives them, a table without rows is left out
            cleaned[name] = arrow.filter(keep)
    return cleaned, dropped


@dataclass
class ReadNotes:
    """What reading ranks one by one, after a load that left some of their tables out, skipped and dropped:
    (rank, note) per skipped file or rank, the rows cleaning dropped, and the valid rows read. Ranks' notes add
    up (``+``); ``add_read_notes`` lists them among the trace's."""

    skipped: list[tuple[int, Skipped]] = field(default_factory=list)
    dropped: Dropped = field(default_factory=Dropped)
    rows_read: int = 0

    def __add__(self, other: ReadNotes) -> ReadNotes:
        return ReadNotes(self.skipped + other.skipped, self.dropped + other.dropped, self.rows_read + other.rows_read)


EARLIER_RUN_REASON = "step numbers start again"  # in the note of the rows of an earlier run (_latest_run_only)


def add_read_notes(trace: Trace, notes: ReadNotes) -> None:
    """``notes`` in ``trace.skipped`` where a load of every table lists them: each file's note in its rank's
    place, one note per table of the rows with an impossible duration, and the rows of an earlier run added to
    the note that names that run."""
    for rank, s in notes.skipped:
        trace.skipped.insert(_rank_note_position(trace.skipped, trace.path, rank, _file_order(Path(s.path).name)), s)
    for note in notes.dropped.insane_notes(trace.path):
        trace.skipped.insert(_insane_note_position(trace.skipped, _insane_note_table(note)), note)
    if notes.dropped.earlier_run_rows:
        for s in trace.skipped:
            if EARLIER_RUN_REASON in s.reason:
                s.lines += notes.dropped.earlier_run_rows
                break


_FILE_ORDER = {MANIFEST_FILE: 0, HEARTBEAT_FILE: 1, **{t.file_name: 2 + i for i, t in enumerate(TABLES.values())}}
_TABLE_ORDER = {name: 2 + i for i, name in enumerate(TABLES)}


def _file_order(name: str) -> int:
    """Where ``read_rank`` reads a rank's file: manifest, heartbeat, then the tables in schema order (a CSV file
    or a schema-2 segment, ``memory.000001.parquet``), events, then anything else."""
    if name in _FILE_ORDER:
        return _FILE_ORDER[name]
    if name == EVENTS_FILE:
        return 2 + len(TABLES)
    return _TABLE_ORDER.get(name.split(".")[0], 3 + len(TABLES))


def _rank_note_position(skipped: list[Skipped], root: Path, rank: int, order: int) -> int:
    """Where a load lists a note of ``rank``'s file of ``order``: before the first note of a later file of the
    rank or of a later rank, after the directory notes."""
    last_keyed = None
    for i, s in enumerate(skipped):
        key = _rank_file_key(Path(s.path), root)
        if key is None:
            continue
        if key > (rank, order):
            return i
        last_keyed = i
    if last_keyed is not None:
        return last_keyed + 1
    return sum(1 for s in skipped if Path(s.path).parent == root and s.path != str(root))


def _rank_file_key(path: Path, root: Path) -> tuple[int, int] | None:
    match = RANK_DIR_RE.match(path.parent.name)
    if path.parent.parent != root or match is None:
        return None
    return int(match.group(1)), _file_order(path.name)


def _insane_note_position(skipped: list[Skipped], name: str) -> int:
    """Where a load lists the note of ``name``'s rows with an impossible duration: before that of a later table,
    else before the note of an earlier run, else last."""
    later = [i for i, s in enumerate(skipped) if _TABLE_ORDER.get(_insane_note_table(s), -1) > _TABLE_ORDER[name]]
    before = [i for i, s in enumerate(skipped) if EARLIER_RUN_REASON in s.reason]
    return (later or before or [len(skipped)])[0]


def _insane_note_table(s: Skipped) -> str | None:
    return s.reason.split(":")[0] if INSANE_REASON in s.reason else None


def _stamp_column(columns) -> str | None:
    """The column that says when a row was recorded, which an earlier run's cut compares."""
    return "start_us" if "start_us" in columns else "time_us" if "time_us" in columns else None


def _drop_insane_durations(data: dict, skipped: list[Skipped], path: Path) -> dict:
    """Rows with a negative duration, or one over MAX_DURATION_US (typically start and duration swapped: "costs
    the job 1795514172969.3 ms/step"), are dropped and counted; an unfinished collective (null) is kept."""
    out = dict(data)
    dropped = Dropped()
    for name in TABLES:
        frame = data.get(name)
        if frame is None or frame.empty or "duration_us" not in frame:
            continue
        bad = insane_durations(frame["duration_us"].to_numpy(dtype="float64", na_value=np.nan))
        if bad.any():
            out[name] = frame[~bad].reset_index(drop=True)
            dropped.insane_rows[name] = int(bad.sum())
    skipped.extend(dropped.insane_notes(path))
    return out


def _latest_run_only(data: dict, skipped: list[Skipped], path: Path) -> dict:
    """A job run twice into the same directory appends a second run to each file: step numbers go back to 0
    (and throughput would double). Keep the latest run of each such rank: rows and events from when its process
    started (``latest_run_cuts``). If the second run's clock is behind the first (time going backwards), the
    runs cannot be told apart by time: only the steps table is cut, by position, and that is said."""
    steps = data["steps"]
    if steps.empty:
        return data
    cuts, positional = latest_run_cuts(steps, process_starts_us(data["manifests"]))
    if not cuts and not positional:
        return data
    out = dict(data)
    out["earlier_run_cuts_us"] = cuts
    dropped = 0
    for name in (*TABLES, "events"):  # an earlier run's step errors and exits are not this run's
        frame = out[name]
        column = _stamp_column(frame.columns)
        if frame.empty or column is None or "rank" not in frame:
            continue
        limit = frame["rank"].map(cuts).to_numpy(dtype="float64", na_value=np.nan)
        early = frame[column].to_numpy(dtype="float64", na_value=np.nan) < limit
        if name == "steps":
            first_kept = frame["rank"].map(positional).to_numpy(dtype="float64", na_value=np.nan)
            early |= frame.index.to_numpy() < first_kept
        if early.any():
            dropped += int(early.sum())
            out[name] = frame[~early].reset_index(drop=True)
    ranks = sorted({*cuts, *positional})
    how = "" if not positional else f" (ranks {sorted(positional)}: clock went backwards, only steps separated)"
    skipped.append(
        Skipped(
            str(path),
            f"ranks {ranks[:10]}{'...' if len(ranks) > 10 else ''}: {EARLIER_RUN_REASON} (a second run appended "
            f"to the same files?): only the latest run is analysed, rows of the earlier run left out{how}",
            dropped,
        )
    )
    return out


def process_starts_us(manifests: list[dict]) -> dict[int, int]:
    """rank -> when its latest process started capturing (the manifest's ``start_time_us``: each process
    rewrites the manifest at ``diag.init``), where the manifest says so plausibly."""
    starts: dict[int, int] = {}
    for raw in manifests:
        rank, start_us = raw.get("rank"), raw.get("start_time_us")
        if type(rank) is int and type(start_us) is int and 0 < start_us < 2**62:
            starts[rank] = start_us
    return starts


def latest_run_cuts(
    steps: pd.DataFrame, starts_us: dict[int, int] | None = None
) -> tuple[dict[int, float], dict[int, int]]:
    """Ranks whose step numbers start again (a second run appended): rank -> the time before which rows belong
    to the earlier run, and rank -> the steps row index where the latest run begins when its clock went back.

    Rows before the cut are the earlier run's, in every table and in the events (``_cut_between_runs_us``).

    A second run is a second process: where the manifest says when the latest process started
    (``starts_us``), a number repeated within that process (``diag.step(global_step)`` called once per
    micro-batch, which capture warns about) is that process's steps, not a run appended. Numbers that go back
    are a run appended, as are repeats across the process's start."""
    cuts: dict[int, float] = {}
    positional: dict[int, int] = {}
    starts_us = starts_us or {}
    order = np.argsort(steps["rank"].to_numpy(), kind="stable")  # each rank's rows in their order
    ranks, numbers = steps["rank"].to_numpy()[order], steps["step"].to_numpy()[order]
    if not ((ranks[1:] == ranks[:-1]) & (numbers[1:] <= numbers[:-1])).any():
        return cuts, positional  # no rank's steps start again: no per-rank loop (2.4 s at 16,384 ranks)
    for rank, group in steps.groupby("rank", sort=False):
        numbers = group["step"].to_numpy()
        back = numbers[1:] <= numbers[:-1]
        start_us = starts_us.get(int(rank))
        if start_us is not None:
            begins = group["start_us"].to_numpy(dtype="float64", na_value=np.nan)
            same_process = (begins[:-1] >= start_us) & (begins[1:] >= begins[:-1])
            back &= ~(same_process & (numbers[1:] == numbers[:-1]))
        back = np.flatnonzero(back)
        if not len(back):
            continue
        first = int(back[-1]) + 1
        previous_end = float(group["start_us"].iloc[first - 1] + group["duration_us"].iloc[first - 1])
        latest_begin = float(group["start_us"].iloc[first])
        if latest_begin >= previous_end:
            cuts[int(rank)] = _cut_between_runs_us(previous_end, latest_begin, start_us)
        else:
            positional[int(rank)] = int(group.index[first])
    return cuts, positional


def _cut_between_runs_us(previous_end_us: float, latest_begin_us: float, process_start_us: int | None) -> float:
    """When the latest run begins. Rows are written between the runs: the earlier run's last memory sample and
    calibration as it exits, the latest run's start-up calibration. The latest process's start (manifest) parts
    them; without one between the runs, the latest run's first step does, so no earlier row is kept (its memory
    peak or its samples counted with the latest run's)."""
    if process_start_us is not None and previous_end_us <= process_start_us <= latest_begin_us:
        return float(process_start_us)
    return latest_begin_us


def _world_size(manifests: dict[int, Manifest], ranks: list[int], skipped: list[Skipped], path: Path) -> int | None:
    """The manifests' world size (plausible ones only: the parser dropped and named the others), at least the
    highest rank present + 1; otherwise the one implied by the ranks present."""
    implied = max(ranks) + 1 if ranks else None
    sizes = [m.world_size for m in manifests.values() if m.world_size is not None]
    world_size = max(sizes) if sizes else None
    if world_size is not None and implied is not None and world_size < implied:
        skipped.append(Skipped(str(path), f"world_size {world_size} but rank {implied - 1} present: using {implied}"))
        world_size = implied
    return world_size or implied


def _drop_ranks(data: dict, ranks: set[int]) -> dict:
    out = dict(data)
    out["manifests"] = [m for m in data["manifests"] if m.get("rank") not in ranks]
    out["nccl_logs"] = {r: log for r, log in data.get("nccl_logs", {}).items() if r not in ranks}
    for key in (*TABLES, "heartbeats", "events"):
        frame = data[key]
        if not frame.empty and "rank" in frame:
            out[key] = frame[~frame["rank"].isin(ranks)].reset_index(drop=True)
    return out
