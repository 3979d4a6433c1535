"""The last rows of a rank's table, without reading the rest: what ``diag triage`` needs of a large trace.

A hang is decided by the collectives each rank issued last (the pending one, the last ones completed, the
issue order just before): reading every record of every rank costs minutes and gigabytes at thousands of
ranks (153 s and 9.4 GB at 1,024 ranks x 20,000 collectives, docs/benchmarks.md). Here each table of a rank is
read from its end: a version-1 CSV file from a byte offset near its end (its header checked from its first
lines), version-2 segments from the newest back, until ``rows`` rows are read (of a Parquet segment, only its last
row groups). The rows go through the
loader's own per-file reads (``TraceReader``), so they get the same checks (corrupt rows dropped and counted,
non-finite floats null, rows without a required value dropped) as ``diag.load`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from diag.trace.loader import TraceReader, read_file_bytes
from diag.trace.schema import CSV_SCHEMA_VERSION, Table, parse_marker

CSV_TAIL_BYTES_PER_ROW = 160  # a collectives row is ~90 bytes of CSV: read this much per row asked, then more
HEADER_BYTES_MAX = 64 << 10  # the marker and header lines are far shorter
# The columns of each table triage reads (sources.py: _diag_ops, TriageInput.steps). Of a Parquet segment's last row
# groups only these are decoded, with the columns that cannot be null (the others read as nulls,
# TableSegments.columns): a decoded column costs ~50-85 us whatever its rows, so the steps' 8 of 14 columns save a
# little (benchmarks/profile_triage_read.py --all-columns; within that box's noise, docs/benchmarks.md).
TRIAGE_COLUMNS = {
    "steps": ("step", "duration_us", "comm_wait_us", "data_wait_us"),
    "collectives": ("step", "pg", "seq", "op", "bytes", "dtype", "peer", "start_us", "duration_us"),
}
NULLABLE_DTYPES = ("Int64", "Float64", "category")  # read as nulls when left out (TableSegments._conform)


def tail_columns(table: Table) -> tuple[str, ...] | None:
    """The columns of ``table`` decoded for triage (None: all)."""
    read = TRIAGE_COLUMNS.get(table.name)
    if read is None:
        return None
    return tuple(c.name for c in table.columns if c.name in read or c.dtype not in NULLABLE_DTYPES)


@dataclass
class Tail:
    """The last rows of one table of one rank, and whether earlier rows were left unread."""

    arrow: pa.Table | None
    cut: bool


def read_tail(
    reader: TraceReader, rank_dir: Path, names: list[str], table: Table, rows: int, skipped: list, copy: bool = True
) -> Tail:
    """The last ``rows`` rows of ``table`` in ``rank_dir`` (its CSV rows first, then its segments', as the
    loader orders them). ``names``: the directory's listing. ``copy=False``: the rows as a slice of what was
    decoded, for a caller that copies many ranks' slices at once (``sources.Tails``)."""
    # version-2 segments from the newest back, read afresh (a live stream stays live: the newest one is always read)
    segments = Tail(*reader.read_segments_tail(rank_dir, names, table, rows, skipped, tail_columns(table)))
    have = segments.arrow.num_rows if segments.arrow is not None else 0
    csv = Tail(None, False)
    if have < rows:
        csv = _csv_tail(reader, rank_dir / table.file_name, table, rows - have, skipped)
    elif (rank_dir / table.file_name).exists():
        csv = Tail(None, True)  # an earlier run's CSV rows, all before the segments' rows: not needed
    parts = [t.arrow for t in (csv, segments) if t.arrow is not None and t.arrow.num_rows]
    if not parts:
        return Tail(None, csv.cut or segments.cut)
    arrow = pa.concat_tables(parts).unify_dictionaries() if len(parts) > 1 else parts[0]
    cut = csv.cut or segments.cut or arrow.num_rows > rows
    if arrow.num_rows > rows and not copy:
        arrow = arrow.slice(arrow.num_rows - rows)
    elif arrow.num_rows > rows:  # a copy: a slice would keep the whole decoded table alive (or pickle it whole)
        arrow = arrow.take(np.arange(arrow.num_rows - rows, arrow.num_rows))
    return Tail(arrow, cut)


def _csv_tail(reader: TraceReader, path: Path, table: Table, rows: int, skipped: list) -> Tail:
    """A version-1 file read from near its end: its header checked from its first lines (a file that is not
    this table's is read whole, so the loader names it as it would), then its complete rows from the first
    line boundary after ``size - rows x CSV_TAIL_BYTES_PER_ROW``, doubled until enough rows came."""
    try:
        size = path.stat().st_size
    except OSError:
        return Tail(None, False)
    header_end, columns = _csv_header(path, table)
    span = rows * CSV_TAIL_BYTES_PER_ROW
    while True:
        whole = columns is None or size - header_end <= span  # from the start: the loader's whole read, header included
        chunk = reader.read_table_file(path, table, 0 if whole else _line_start(path, size - span), columns)
        if whole or (chunk.table is not None and chunk.table.num_rows >= rows):
            skipped.extend(chunk.skipped)
            return Tail(chunk.table, not whole)
        span *= 4


def _csv_header(path: Path, table: Table) -> tuple[int, int | None]:
    """(byte where the rows begin, columns the header names), or (0, None) if the first lines are not this
    table's marker and header."""
    try:
        head = read_file_bytes(path, max_bytes=HEADER_BYTES_MAX, head=True)
    except OSError:
        return 0, None
    first = head.find(b"\n")
    second = head.find(b"\n", first + 1) if first >= 0 else -1
    if second < 0:
        return 0, None
    parsed = parse_marker(head[:first].decode("utf-8", "replace"))
    if parsed is None or parsed[1] != table.name:
        return 0, None
    if parsed[0] != CSV_SCHEMA_VERSION:
        return 0, None
    columns = table.header_columns(head[first + 1 : second].decode("utf-8", "replace").split(","))
    return second + 1, columns


def _line_start(path: Path, near: int) -> int:
    """The first byte of the first line that begins at or after ``near``."""
    with open(path, "rb") as handle:
        handle.seek(max(0, near - 1))
        chunk = handle.read(1 << 16)
    newline = chunk.find(b"\n")
    return max(0, near - 1) + newline + 1 if newline >= 0 else near
