"""Schema version 2: a rank's table as Arrow record batches, written and read segment by segment.

Writing (``StreamSegmentWriter``, driven by ``diag.trace.writer.RankWriter`` on its flushing thread): each flush
appends one record batch to the table's live segment ``steps.000001.arrows``, an Arrow IPC *stream* (zstd-compressed
buffers, category columns dictionary-encoded with dictionary deltas), in one write, so a reader sees whole
messages or a message still being written. When a segment holds ``COMPACT_ROWS`` rows, and at ``finish``, its
batches (kept in memory) are written as ``steps.000001.parquet`` (row groups of ``ROW_GROUP_ROWS`` rows,
Parquet's delta and byte-stream-split encodings, zstd): a temporary file, renamed over, then the stream removed. A reader that sees
both takes the Parquet one; a stream whose Parquet twin never came (a SIGKILL) is read as it is.

Reading (``TableSegments``, used by ``diag.trace.loader``): segments in number order; a stream incrementally
from the byte where the last complete message ended (its schema and dictionary messages are kept and replayed
in front of the new bytes), a Parquet segment once, skipping the rows already read from its stream. A tail read
(``tail_rows``: ``diag triage``) goes from the newest segment back and decodes only a Parquet segment's last row
groups, until it has the rows asked. A last
message still being written is left for the next read; anything that is not a diag segment, or is damaged, is
named in ``skipped`` and its readable rows kept.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from diag.trace.schema import MARKER_PREFIX, TABLES, Table, parse_marker, segment_name

COLUMNAR_SCHEMA_VERSION = 2
MARKER_KEY = b"diag-trace"  # Arrow schema metadata (also kept in the Parquet footer): the table's marker line
SEGMENT_RE = re.compile(r"^([a-z_]+)\.(\d{6})\.(arrows|parquet)$")
STREAM_SUFFIX = "arrows"
PARQUET_SUFFIX = "parquet"
# A live segment is compacted into Parquet at this many rows: it bounds what a SIGKILL leaves uncompacted (the
# stream is ~2-5x Parquet's size) and the writer's memory (the segment's batches are kept for compaction)
COMPACT_ROWS = 1 << 16
# Rows per Parquet row group: a reader of a segment's last rows (diag triage) decodes only its last row groups
# instead of the whole segment (60,000 collectives: 0.62 ms instead of 2.00 ms). More groups cost the readers of
# whole segments (diag.load: 2.14 -> 2.38 ms here, 4.63 ms at 4,096 rows a group: pyarrow unifies each group's
# dictionaries) and a little size (2.63 -> 2.74 B/row). benchmarks/bench_row_groups.py, docs/benchmarks.md.
ROW_GROUP_ROWS = 16384
ZSTD_LEVEL = 3
# Framing of an IPC stream message: 0xFFFFFFFF, then the metadata's length. Metadata is a small flatbuffer and
# diag's batches are far below these; larger declared lengths are damage, not a message still being written.
_CONTINUATION = b"\xff\xff\xff\xff"
MAX_METADATA_BYTES = 1 << 20
MAX_BODY_BYTES = 1 << 30

ARROW_TYPES = {
    "int64": pa.int64(),
    "Int64": pa.int64(),
    "int8": pa.int8(),
    "Float64": pa.float64(),
    "category": pa.dictionary(pa.int32(), pa.string()),
}


def marker(table: Table) -> str:
    return f"{MARKER_PREFIX} schema={COLUMNAR_SCHEMA_VERSION} table={table.name}"


def arrow_schema(table: Table) -> pa.Schema:
    fields = [pa.field(c.name, ARROW_TYPES[c.dtype]) for c in table.columns]
    return pa.schema(fields, metadata={MARKER_KEY: marker(table).encode()})


def parse_segment_name(name: str) -> tuple[str, int, str] | None:
    """(table, number, suffix) of a segment file name, or None."""
    match = SEGMENT_RE.match(name)
    return (match.group(1), int(match.group(2)), match.group(3)) if match else None


# -- writing ---------------------------------------------------------------------------------------------------


def _integers(values: tuple, arrow_type: pa.DataType) -> pa.Array:
    """What v1's CSV would have written as an integer: ints (bools as 0/1), integral floats; anything else null
    (a required column's null makes the loader drop that row as corrupt, as a garbled CSV row would be)."""
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        coerced = []
        for value in values:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            coerced.append(int(value) if isinstance(value, int) else None)
        try:
            return pa.array(coerced, arrow_type)
        except (pa.ArrowInvalid, OverflowError):  # out of range for the type
            return pa.nulls(len(values), arrow_type)


def _floats(values: tuple) -> pa.Array:
    try:
        return pa.array(values, pa.float64(), from_pandas=True)  # NaN -> null, as v1 wrote an empty field
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        coerced = [float(v) if isinstance(v, int | float) else None for v in values]
        return pa.array(coerced, pa.float64(), from_pandas=True)


class _Dictionary:
    """A category column's strings -> codes, growing over one segment: the stream writer then emits only the
    new strings (a dictionary delta) with the batch that first uses them."""

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.values: list[str] = []

    def encode(self, values: tuple) -> pa.DictionaryArray:
        codes, known = self.codes, self.values
        indices = []
        for value in values:
            if value is None:
                indices.append(None)
                continue
            text = value if type(value) is str else str(value)
            code = codes.get(text)
            if code is None:
                code = codes[text] = len(known)
                known.append(text)
            indices.append(code)
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(known, pa.string()))


def batch_from_rows(table: Table, rows: list[tuple], dictionaries: dict[str, _Dictionary]) -> pa.RecordBatch:
    """One record batch of ``rows`` (tuples in the table's column order, as capture builds them)."""
    columns = list(zip(*rows)) if rows else [() for _ in table.columns]
    arrays = []
    for column, values in zip(table.columns, columns):
        if column.dtype == "category":
            arrays.append(dictionaries.setdefault(column.name, _Dictionary()).encode(values))
        elif column.dtype == "Float64":
            arrays.append(_floats(values))
        else:
            arrays.append(_integers(values, ARROW_TYPES[column.dtype]))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(table))


def parquet_options(table: Table) -> dict:
    """pyarrow.parquet.ParquetWriter options for a table's segments (measured in benchmarks/bench_storage.py):
    dictionaries for categories and flags, DELTA_BINARY_PACKED for integers (instants and counters grow by
    small steps), BYTE_STREAM_SPLIT for floats, all zstd. Statistics only for the step and time columns (a
    reader may skip a segment outside its step window); no Arrow schema in the footer (the loader knows the
    types; ~1 KB a file, which on a short run's small segments is a fifth of the file)."""
    encodings = {}
    dictionary = []
    for column in table.columns:
        if column.dtype in ("category", "int8"):
            dictionary.append(column.name)
        elif column.dtype in ("int64", "Int64"):
            encodings[column.name] = "DELTA_BINARY_PACKED"
        else:
            encodings[column.name] = "BYTE_STREAM_SPLIT"
    return {
        "compression": "zstd",
        "compression_level": ZSTD_LEVEL,
        "use_dictionary": dictionary,
        "column_encoding": encodings,
        "write_statistics": [c for c in ("step", "start_us", "time_us") if c in table.column_names],
        "store_schema": False,
    }


def write_parquet(table: Table, arrow: pa.Table, path: Path) -> None:
    """``arrow`` (the table's columns) as a Parquet segment at ``path``, in row groups of ``ROW_GROUP_ROWS`` rows,
    atomically (a temporary file renamed into place): a reader sees the whole segment or none of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with contextlib.suppress(FileNotFoundError):  # a link planted at the name is removed, not written through
            tmp.unlink()
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
        with pq.ParquetWriter(tmp, arrow.schema, **parquet_options(table)) as writer:
            writer.write_table(arrow, row_group_size=ROW_GROUP_ROWS)
            writer.add_key_value_metadata({MARKER_KEY: marker(table).encode()})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def warm_up() -> None:
    """Run pyarrow's conversion and IPC paths once, on the calling thread (``diag.init``'s). Converting a Python
    sequence the first time makes pyarrow import pandas (its check for pandas objects), ~0.4 s holding the GIL:
    on the writer thread's first flush that stalled the training thread mid-step (and widened races, e.g. a
    flush the training thread waited on). Paid here, once, before the first step."""
    for table in TABLES.values():
        sample = tuple(_SAMPLE_VALUES[c.dtype] for c in table.columns)
        batch = batch_from_rows(table, [sample], {})
        sink = pa.BufferOutputStream()
        options = ipc.IpcWriteOptions(compression="zstd", emit_dictionary_deltas=True, use_threads=False)
        with ipc.new_stream(sink, batch.schema, options=options) as stream:
            stream.write_batch(batch)


_SAMPLE_VALUES = {"int64": 0, "Int64": 0, "int8": 0, "Float64": 0.5, "category": "x"}


class StreamSegmentWriter:
    """The live segments of one table of one rank directory. Not thread-safe: the RankWriter's lock serialises
    its calls. Raises OSError (the RankWriter disables itself on it)."""

    def __init__(self, rank_dir: Path, table: Table, compact_rows: int = COMPACT_ROWS):
        self.rank_dir = rank_dir
        self.table = table
        self.compact_rows = compact_rows
        self.bytes_written = 0
        self._number = _next_number(rank_dir, table)
        self._handle = None
        self._ipc = None
        self._written = 0  # bytes of the live segment so far
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        self._dictionaries: dict[str, _Dictionary] = {}

    def append(self, rows: list[tuple]) -> None:
        batch = batch_from_rows(self.table, rows, self._dictionaries)
        if self._ipc is None:
            self._open()
        self._ipc.write_batch(batch)
        self._flush()
        self._batches.append(batch)
        self._rows += batch.num_rows
        if self._rows >= self.compact_rows:
            self.compact()

    def compact(self) -> None:
        """Close the live segment and rewrite it as Parquet; the next rows start a new segment."""
        if self._ipc is None:
            return
        self._ipc.close()  # the end-of-stream marker
        self._flush()
        self._handle.close()
        stream = self._path(STREAM_SUFFIX)
        arrow = pa.Table.from_batches(self._batches, schema=arrow_schema(self.table))
        self._ipc = self._handle = None
        self._batches, self._rows, self._dictionaries = [], 0, {}
        write_parquet(self.table, arrow, self._path(PARQUET_SUFFIX))
        stream.unlink()
        self._number += 1
        self._written = 0

    def close(self) -> None:
        try:
            self.compact()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close the live segment as it is (the writer failed: it stays a stream, read as one), cut back to its
        last whole flush: a write that failed part-way (a full disk) leaves part of a message in the file, and
        closing the buffered sink writes what it still holds behind it, which no reader could decode."""
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            with contextlib.suppress(OSError):
                os.truncate(self._path(STREAM_SUFFIX), self._written)
        self._ipc = self._handle = None

    def _open(self) -> None:
        # created exclusively: a segment of another writer (a second job into the same directory) is never appended to
        while True:
            try:
                self._handle = self._open_sink(self._path(STREAM_SUFFIX))
                break
            except FileExistsError:
                self._number += 1
        # use_threads=False: no Arrow thread pool in the training process (compressing one small batch gains nothing)
        options = ipc.IpcWriteOptions(compression="zstd", emit_dictionary_deltas=True, use_threads=False)
        self._ipc = ipc.new_stream(self._handle, arrow_schema(self.table), options=options)

    @staticmethod
    def _open_sink(path: Path) -> pa.NativeFile:
        """A new file, buffered in C++ (the IPC writer's many small writes reach the file as one write per
        flush, without the GIL); raises FileExistsError if the name is taken (by a planted link too: O_EXCL)."""
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644))
        return pa.BufferedOutputStream(pa.OSFile(str(path), "a"), buffer_size=1 << 20)

    def _flush(self) -> None:
        self._handle.flush()
        position = self._handle.tell()
        self.bytes_written += position - self._written
        self._written = position

    def _path(self, suffix: str) -> Path:
        return self.rank_dir / segment_name(self.table.name, self._number, suffix)


def _next_number(rank_dir: Path, table: Table) -> int:
    """One more than the table's highest segment in ``rank_dir`` (1 in a new directory)."""
    try:
        names = os.listdir(rank_dir)
    except OSError:
        return 1
    numbers = [p[1] for p in map(parse_segment_name, names) if p is not None and p[0] == table.name]
    return max(numbers, default=0) + 1


# -- reading ---------------------------------------------------------------------------------------------------


@dataclass
class Note:
    """Something a read could not use: the loader turns it into a Skipped entry."""

    path: str
    reason: str
    rows: int = 0


@dataclass
class _StreamState:
    offset: int = 0  # byte after the last complete message read
    prefix: bytes = b""  # the schema and dictionary messages so far, replayed before new record batches
    rows: int = 0  # rows read from it


NULLABLE_DTYPES = ("Int64", "Float64", "category")  # a column of these that a segment lacks reads as nulls


def required_columns(table: Table) -> tuple[str, ...]:
    """The columns every segment of ``table`` holds: reading only some columns (``TableSegments.columns``) must
    read these."""
    return tuple(c.name for c in table.columns if c.dtype not in NULLABLE_DTYPES)


@dataclass
class TableSegments:
    """What has been read of one table's segments in one rank directory."""

    table: Table
    streams: dict[int, _StreamState] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # segments read to the end (Parquet) or given up (damaged)
    # Parquet segments: read only these columns (None: all); the others read as nulls, so only nullable ones
    # may be left out (diag.analysis.collective_waits: a collective's dtype, peer and source are never analysed,
    # and not decoding them is ~0.4 of the ~1.3 ms of reading a rank's 20,000 collectives)
    columns: tuple[str, ...] | None = None
    cut: bool = False  # the last tail read (read_new's tail_rows) left earlier rows unread
    # A windowed one-off read (diag export --steps): (column, low, high), both ends inclusive. Only the Parquet
    # row groups whose statistics of that column meet [low, high] are decoded (``row_groups_meeting``), and only
    # a stream's record batches whose values do (found by decoding that column alone); a segment without those
    # statistics is read whole. Whole groups and batches come back: the caller keeps the window's rows exactly.
    # Not for incremental reads (a stream's rows counted are those read, not those written).
    window: tuple[str, float, float] | None = None

    def read_new(
        self, rank_dir: Path, names: list[str], notes: list[Note], tail_rows: int | None = None
    ) -> pa.Table | None:
        """Rows appended to the table's segments since the last call, in segment order (``names``: the rank
        directory's listing). ``tail_rows``: only the last rows, at least that many where there are: segments
        from the newest back, a Parquet segment's last row groups only, a stream's last record batches only;
        ``self.cut`` then says whether earlier rows were left unread (read so, the segments are not read
        incrementally after)."""
        segments: dict[int, set[str]] = {}
        for name in names:
            parsed = parse_segment_name(name)
            if parsed is not None and parsed[0] == self.table.name:
                segments.setdefault(parsed[1], set()).add(parsed[2])
        parts = []
        last = max(segments, default=0)
        have = 0
        self.cut = False
        order = sorted(segments, reverse=tail_rows is not None)
        for number in order:
            if number in self.done:
                continue
            if tail_rows is not None and have >= tail_rows:
                self.cut = True
                break
            if PARQUET_SUFFIX in segments[number]:
                path = rank_dir / segment_name(self.table.name, number, PARQUET_SUFFIX)
                part = self._read_parquet(path, number, notes, None if tail_rows is None else tail_rows - have)
            else:
                path = rank_dir / segment_name(self.table.name, number, STREAM_SUFFIX)
                part = self._read_stream(
                    path, number, number == last, notes, None if tail_rows is None else tail_rows - have
                )
            if part is not None and part.num_rows:
                parts.append(part)
                have += part.num_rows
        if not parts:
            return None
        if tail_rows is not None:
            parts.reverse()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def _read_parquet(self, path: Path, number: int, notes: list[Note], last_rows: int | None = None):
        """The segment's rows not read yet from its stream; ``last_rows``: only its last row groups that hold
        at least that many rows."""
        self.done.add(number)  # immutable once renamed into place: read once
        already = self.streams.pop(number, _StreamState()).rows
        try:
            categories = [c.name for c in self.table.columns if c.dtype == "category"]
            # ParquetFile, not read_table: no dataset discovery; one thread: the loader reads ranks in parallel
            data = _read_regular(path)
            file = pq.ParquetFile(pa.BufferReader(data), read_dictionary=categories)
            _check_rows(file.metadata.num_rows, len(data))
            _check_names(file.schema_arrow.names)
            columns = self._wanted(file.schema_arrow.names)
            first = _first_group(file.metadata, last_rows)
            groups = None
            if self.window is not None and last_rows is None and not already:
                groups = row_groups_meeting(file.metadata, *self.window)
            if groups is not None and len(groups) < file.metadata.num_row_groups:
                # the window's row groups only; none: no decoding, the file's schema still checked by _conform
                arrow = file.read_row_groups(groups, columns=columns, use_threads=False)
            elif first == 0:
                arrow = file.read(columns=columns, use_threads=False)
            else:
                groups = range(first, file.metadata.num_row_groups)
                arrow = file.read_row_groups(groups, columns=columns, use_threads=False)
                self.cut = True
        except (OSError, pa.ArrowException, ValueError) as exc:
            notes.append(Note(str(path), f"unreadable Parquet segment: {_short(exc)}"))
            return None
        conformed = self._conform(arrow, path, notes)
        return None if conformed is None else conformed.slice(already)

    def _wanted(self, present: list[str]) -> list[str] | None:
        """The file's columns to read: those asked for, under their name or their former one."""
        if self.columns is None:
            return None
        wanted = {n for c in self.table.columns if c.name in self.columns for n in (c.name, c.former_name) if n}
        return [n for n in present if n in wanted]

    def _read_stream(
        self, path: Path, number: int, live: bool, notes: list[Note], last_rows: int | None = None
    ) -> pa.Table | None:
        """The stream's record batches not read yet; ``last_rows``: only its last batches that hold at least
        that many rows (the stream is then not read incrementally after)."""
        state = self.streams.setdefault(number, _StreamState())
        try:
            data = _read_regular(path, state.offset)
        except FileNotFoundError:
            return None  # compacted since the listing: its Parquet twin is read at the next poll
        except OSError as exc:
            self.done.add(number)
            notes.append(Note(str(path), f"unreadable: {_short(exc)}"))
            return None
        end, messages, problem = _complete_messages(data)
        if problem is not None or (end < len(data) and not live and not _is_end_marker(data[end:])):
            # damage, or a segment that will never be finished (a later one exists): what follows is lost
            self.done.add(number)
            why = problem or "ends in an incomplete message (the writer was killed while writing it?)"
            notes.append(Note(str(path), f"damaged Arrow stream segment from byte {state.offset + end}: {why}"))
        if not messages:
            return None
        if state.offset == 0 and messages[0][0] != "schema":
            self.done.add(number)
            notes.append(Note(str(path), "not a diag trace segment (no Arrow schema at its start)"))
            return None
        try:
            if last_rows is None and self.window is not None:
                arrow = self._stream_window(state.prefix, data, messages)
            elif last_rows is None:
                arrow = ipc.open_stream(pa.py_buffer(state.prefix + data[:end])).read_all()
            else:
                arrow = self._stream_tail(state.prefix, data, messages, last_rows)
            arrow.validate()  # buffers as long as the lengths claimed (2**40 rows in a few KB: ArrowInvalid here)
            _check_rows(arrow.num_rows, end)
            _check_names(arrow.column_names)
        except (pa.ArrowException, OSError, ValueError) as exc:
            self.done.add(number)
            arrow = _leading_batches(state.prefix, data, messages)
            kept = f"; its first {arrow.num_rows} rows kept" if arrow is not None else ""
            notes.append(Note(str(path), f"unreadable Arrow stream segment: {_short(exc)}{kept}"))
            return None if arrow is None else self._conform(arrow, path, notes)
        state.prefix += b"".join(data[a:b] for kind, a, b in messages if kind in ("schema", "dictionary"))
        state.offset += end
        conformed = self._conform(arrow, path, notes)
        if conformed is None:
            self.done.add(number)
            return None
        state.rows += conformed.num_rows
        return conformed

    def _stream_tail(self, prefix: bytes, data: bytes, messages: list, last_rows: int) -> pa.Table:
        """The last record batches of a stream, at least ``last_rows`` rows where it has them: its schema and
        every dictionary message (deltas in their order), then only those batches, decoded. Decoding costs per
        batch (~0.25 ms: each batch's buffers decompressed apart), and a live stream holds a batch per flush."""
        head = prefix + b"".join(data[a:b] for kind, a, b in messages if kind != "record batch")
        batches = [(a, b) for kind, a, b in messages if kind == "record batch"]
        take = 1
        while True:
            body = b"".join(data[a:b] for a, b in batches[len(batches) - take :])
            arrow = ipc.open_stream(pa.py_buffer(head + body)).read_all()
            if arrow.num_rows >= last_rows or take >= len(batches):
                self.cut |= take < len(batches)
                return arrow
            per_batch = max(1, arrow.num_rows // max(1, take))
            take = min(len(batches), max(take + 1, -(-last_rows // per_batch)))

    def _stream_window(self, prefix: bytes, data: bytes, messages: list) -> pa.Table:
        """The record batches of a stream whose ``self.window`` column has a value in the window (or only nulls):
        that column decoded alone for every batch (``IpcReadOptions.included_fields``: the other columns' buffers
        are not decompressed), then the batches kept decoded whole behind the schema and every dictionary message
        (deltas in their order, as ``_stream_tail`` does). A live stream holds one batch per flush."""
        column, low, high = self.window
        head = prefix + b"".join(data[a:b] for kind, a, b in messages if kind != "record batch")
        batches = [(a, b) for kind, a, b in messages if kind == "record batch"]
        body = b"".join(data[a:b] for a, b in batches)
        names = ipc.open_stream(pa.py_buffer(head)).schema.names
        if column not in names:
            return ipc.open_stream(pa.py_buffer(head + body)).read_all()
        options = ipc.IpcReadOptions(included_fields=[names.index(column)])
        kept = []
        for (a, b), batch in zip(batches, ipc.open_stream(pa.py_buffer(head + body), options=options)):
            extremes = pc.min_max(batch.column(0))
            lowest, highest = extremes["min"].as_py(), extremes["max"].as_py()
            if lowest is None or (highest >= low and lowest <= high):
                kept.append(data[a:b])
        return ipc.open_stream(pa.py_buffer(head + b"".join(kept))).read_all()

    def _conform(self, arrow: pa.Table, path: Path, notes: list[Note]) -> pa.Table | None:
        """The table's columns by name (a column added to the schema after the file was written reads as
        empty), with the schema's Arrow types; None, with a note, if the file is not this table's."""
        parsed = parse_marker((arrow.schema.metadata or {}).get(MARKER_KEY, b"").decode("utf-8", "replace"))
        if parsed is None:
            notes.append(Note(str(path), "not a diag trace segment (no diag-trace marker in its schema)"))
            return None
        version, name = parsed
        if version != COLUMNAR_SCHEMA_VERSION or name != self.table.name:
            notes.append(
                Note(str(path), f"schema version {version} table {name!r}, expected version 2 {self.table.name!r}")
            )
            return None
        if arrow.column_names == self.table.column_names and arrow.schema.types == _arrow_types(self.table):
            return pa.Table.from_arrays(arrow.columns, names=self.table.column_names)  # as written: nothing to do
        arrays = []
        present = set(arrow.column_names)
        for column in self.table.columns:
            names = [n for n in (column.name, column.former_name) if n and n in present]
            wanted = ARROW_TYPES[column.dtype]
            if not names:
                if column.dtype not in NULLABLE_DTYPES:
                    notes.append(Note(str(path), f"column {column.name!r} missing"))
                    return None
                arrays.append(pa.nulls(arrow.num_rows, wanted))
                continue
            values = arrow.column(names[0])
            try:
                arrays.append(values if values.type == wanted else values.cast(wanted))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                notes.append(Note(str(path), f"column {column.name!r} is not {column.dtype}: {_short(exc)}"))
                return None
        return pa.Table.from_arrays(arrays, names=self.table.column_names)


@functools.cache
def _arrow_types(table: Table) -> list[pa.DataType]:
    return [ARROW_TYPES[c.dtype] for c in table.columns]


def row_groups_meeting(metadata: pq.FileMetaData, column: str, low: float, high: float) -> list[int] | None:
    """The row groups whose statistics of ``column`` (written for the step and time columns: ``parquet_options``)
    say they may hold a value in [low, high]; None when the column or a non-empty group's minimum and maximum are
    missing (a file written without statistics: read it whole). A group whose values are all null has no
    minimum: it is kept (its rows are the loader's to drop)."""
    names = metadata.schema.names
    if column not in names:
        return None
    index = names.index(column)
    groups = []
    for group in range(metadata.num_row_groups):
        chunk = metadata.row_group(group).column(index)
        stats = chunk.statistics if chunk.is_stats_set else None
        if stats is None or not stats.has_min_max:
            if stats is not None and stats.null_count == chunk.num_values:
                groups.append(group)  # only nulls
                continue
            return None
        if stats.max >= low and stats.min <= high:
            groups.append(group)
    return groups


def _first_group(metadata: pq.FileMetaData, last_rows: int | None) -> int:
    """The first of the last row groups that together hold ``last_rows`` rows (0: the whole file)."""
    if last_rows is None:
        return 0
    first, rows = metadata.num_row_groups, 0
    while first > 0 and rows < last_rows:
        first -= 1
        rows += metadata.row_group(first).num_rows
    return first


MAX_ROWS_PER_BYTE = 1  # real segments hold under 0.1 row a byte (times and durations differ from row to row)
MIN_ROWS_CHECKED = 1 << 16  # fewer rows than this cost little, whatever the file's size


def _check_rows(rows: int, size_bytes: int) -> None:
    """Refuse a segment that claims more rows than its bytes can hold as a real trace's: 42 million constant
    rows fit in 2.6 MB of Parquet and take gigabytes once read."""
    if rows > max(size_bytes * MAX_ROWS_PER_BYTE, MIN_ROWS_CHECKED):
        raise ValueError(f"{rows} rows in {size_bytes} bytes: more than a trace segment holds; not read")


def _check_names(names: list[str]) -> None:
    duplicated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    if duplicated:
        raise ValueError(f"column {duplicated[0]!r} appears more than once: not a diag trace segment")


def _complete_messages(data: bytes) -> tuple[int, list[tuple[str, int, int]], str | None]:
    """How many leading bytes of ``data`` are complete IPC messages, those messages as (type, start, end), and
    what is wrong with the rest when it is damage rather than a message still being written."""
    messages: list[tuple[str, int, int]] = []
    position = 0
    reader = pa.BufferReader(pa.py_buffer(data))
    stream = ipc.MessageReader.open_stream(reader)
    while position < len(data):
        head = data[position : position + 8]
        if len(head) < 8 or head == _CONTINUATION + b"\0\0\0\0":
            break  # a message being written, or the end-of-stream marker
        if head[:4] != _CONTINUATION:
            return position, messages, "not an Arrow IPC message"
        metadata_bytes = int.from_bytes(head[4:], "little", signed=True)
        if not 0 < metadata_bytes <= MAX_METADATA_BYTES:
            return position, messages, f"message metadata of {metadata_bytes} bytes"
        try:
            message = stream.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as exc:
            text = str(exc)
            if "Expected to" in text or "only" in text:  # fewer bytes than declared: still being written
                declared = re.search(r"read (\d+)", text)
                if declared and int(declared.group(1)) > MAX_BODY_BYTES:
                    return position, messages, f"message of {declared.group(1)} bytes"
                break
            return position, messages, _short(exc)
        end = reader.tell()
        messages.append((message.type, position, end))
        position = end
    return position, messages, None


def _leading_batches(prefix: bytes, data: bytes, messages: list) -> pa.Table | None:
    """A damaged stream's record batches up to the first that does not decode (the bytes of a write that failed
    part-way, then others written behind them, frame as a message but decode as garbage); None if there are
    none."""
    batches: list[pa.RecordBatch] = []
    try:
        reader = ipc.open_stream(pa.py_buffer(prefix + data[: messages[-1][2]]))
        while True:
            batch = reader.read_next_batch()
            batch.validate(full=True)
            _check_names(batch.schema.names)
            batches.append(batch)
    except (StopIteration, pa.ArrowException, OSError, ValueError):
        pass
    rows = sum(batch.num_rows for batch in batches)
    if not batches or rows > max(len(data) * MAX_ROWS_PER_BYTE, MIN_ROWS_CHECKED):
        return None
    return pa.Table.from_batches(batches)


def _is_end_marker(rest: bytes) -> bool:
    return rest == _CONTINUATION + b"\0\0\0\0"


def _read_regular(path: Path, offset: int = 0) -> bytes:
    """A regular file's bytes from ``offset`` (a FIFO or device under a segment's name is refused unopened)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        handle.seek(offset)
        return handle.read()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
