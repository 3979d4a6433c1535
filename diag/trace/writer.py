"""Append-only writer of one rank's trace files, flushed by a background thread.

The training thread only appends tuples to in-memory lists (a few hundred nanoseconds); formatting and I/O
happen on the writer thread every ``flush_interval_s``, so a rank killed with SIGKILL loses at most that
much. Any I/O error (unwritable directory, full disk) disables the writer with one warning: records are
dropped from then on and nothing is ever raised into the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diag._warn import warn_once
from diag.trace.schema import CSV_SCHEMA_VERSION, EVENTS_FILE, HEARTBEAT_FILE, MANIFEST_FILE, SCHEMA_VERSION, TABLES

TRACE_FORMATS = (CSV_SCHEMA_VERSION, SCHEMA_VERSION)  # 1: CSV tables; 2: Arrow stream segments compacted to Parquet
# What capture writes unless asked: schema 2 (docs/trace-format.md says why it became the default);
# diag.init(trace_format=1) still writes CSV
DEFAULT_TRACE_FORMAT = SCHEMA_VERSION

# Rows kept in memory at most while the writer thread is behind or dead; beyond this they are dropped.
MAX_BUFFERED_ROWS = 500_000


_LINE_BREAKS = str.maketrans({"\n": "\\n", "\r": "\\r"})


def _format_value(value: Any) -> str:
    if value is None:
        return ""
    if type(value) is float:
        return "" if value != value else repr(round(value, 3))
    text = str(value)
    if type(value) is str and ("," in text or '"' in text or "\n" in text or "\r" in text):
        return _quote(text)
    return text


def _quote(text: str) -> str:
    """A name from the user (phase, op, group) as one CSV field: quoted, so a comma or quote cannot forge a
    column or a row. Line breaks are written as the two characters backslash-n / backslash-r: the loader
    reads one row per line (that keeps its parsing parallel and its resumable offsets simple)."""
    return '"' + text.translate(_LINE_BREAKS).replace('"', '""') + '"'


def _nothing() -> None:
    pass


def _ignore_rows(table: str, rows: list) -> None:
    pass


def _format_exact(value: Any) -> str:
    if type(value) is float:
        return "" if value != value else repr(value)
    return _format_value(value)


def format_rows(rows: list[tuple], exact_indexes: tuple[int, ...] = ()) -> str:
    """CSV lines; floats rounded to 3 decimals except in the columns at ``exact_indexes`` (every digit)."""
    if not exact_indexes:
        return "".join(",".join(map(_format_value, row)) + "\n" for row in rows)
    formats = [_format_exact if i in exact_indexes else _format_value for i in range(len(rows[0]))] if rows else []
    return "".join(",".join([f(v) for f, v in zip(formats, row)]) + "\n" for row in rows)


class RankWriter:
    """Writes ``manifest.json``, the tables and ``events.jsonl`` of one rank directory. ``schema_version`` 2
    (the default) writes each table as Arrow stream segments compacted into Parquet (diag/trace/columnar.py);
    1 writes the CSV files of schema version 1."""

    def __init__(
        self, rank_dir: str | os.PathLike, flush_interval_s: float = 0.5, schema_version: int = DEFAULT_TRACE_FORMAT
    ):
        if schema_version not in TRACE_FORMATS:
            raise ValueError(f"trace format {schema_version!r}: diag writes {TRACE_FORMATS}")
        self.rank_dir = Path(rank_dir)
        self.flush_interval_s = flush_interval_s
        self.schema_version = schema_version
        self._segments: dict = {}  # table -> columnar.StreamSegmentWriter (schema version 2)
        if schema_version == SCHEMA_VERSION:
            # pyarrow (and what it imports lazily on first use: pandas) loaded here, at init, not by the writer
            # thread mid-run, where holding the GIL for ~0.4 s stalled the training thread
            from diag.trace.columnar import warm_up

            with contextlib.suppress(Exception):  # only a head start: a real failure warns at the first flush
                warm_up()
        self.enabled = True
        self.rows_dropped = 0
        self.flush_s = 0.0  # CPU time of the flushing threads, in flushes (docs/benchmarks.md)
        self.bytes_written: dict[str, int] = {}
        self._buffers: dict[str, list] = {name: [] for name in TABLES}
        self._events: list[dict] = []
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()  # serialises flushes (writer thread, close, explicit flush)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Sees every batch of rows as it is flushed, on the flushing thread (the Prometheus sink); never on
        # the training thread. It must not raise: the session's sinks catch their own errors.
        self.row_observer: Callable[[str, list], None] = _ignore_rows
        # called on the writer's thread before each timed flush: rows that wait on something outside the
        # training thread (a GPU span's CUDA events) are resolved there, so they reach the files and the live
        # metrics within a flush interval even when the training loop has stopped or hangs
        self.before_flush: Callable[[], None] = _nothing
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True)
            probe = self.rank_dir / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            self._disable(f"cannot write traces to {self.rank_dir} ({exc}); capture is off for this rank")

    # -- called from the training process, any thread -------------------------------------------------
    def append(self, table: str, row: tuple) -> None:
        if not self.enabled:
            return
        buffer = self._buffers[table]
        if len(buffer) >= MAX_BUFFERED_ROWS:
            self._drop_overflow(table)
            return
        buffer.append(row)

    def event(self, kind: str, **fields: Any) -> None:
        if self.enabled:
            self._events.append({"time_us": time.time_ns() // 1000, "kind": kind, **fields})

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="diag-writer", daemon=True)
            self._thread.start()

    def write_manifest(self, manifest: dict) -> None:
        self._write_json_atomically(MANIFEST_FILE, manifest)

    def write_heartbeat(self, heartbeat: dict) -> None:
        self._write_json_atomically(HEARTBEAT_FILE, heartbeat)
        self.row_observer("heartbeat", [heartbeat])  # the hang metrics; on the watchdog's thread

    def write_text(self, name: str, text: str) -> Path | None:
        """Write a side file (stack dumps, memory summaries) into the rank directory."""
        if not self.enabled:
            return None
        path = self.rank_dir / name
        try:
            path.write_text(text)
            return path
        except OSError as exc:
            self._disable(f"cannot write {path} ({exc}); capture is off for this rank")
            return None

    def flush(self) -> None:
        with self._lock:
            started = time.thread_time()
            try:
                self._flush_locked()
            finally:
                self.flush_s += time.thread_time() - started

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush()
        with self._lock:
            for table, segments in self._segments.items():
                try:
                    if self.enabled:
                        segments.close()  # compacted into Parquet
                    else:
                        segments.abandon()
                except Exception as exc:  # OSError, ArrowException: the stream is kept, still read as it is
                    warn_once(f"writer-compact-{self.rank_dir}", f"cannot compact {table} segments ({exc})")
            self._segments.clear()
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._files.clear()

    # -- writer thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.before_flush()
            except Exception as exc:  # the rows it resolves still come at the next step or at finish
                warn_once(
                    f"writer-before-flush-{self.rank_dir}",
                    f"cannot resolve pending rows on the writer thread ({exc!r})",
                )
                self.before_flush = _nothing
            try:
                self.flush()
            except Exception as exc:  # never let the thread die silently with records piling up
                self._disable(f"trace writer failed ({exc!r}); capture is off for this rank")
                return

    def _flush_locked(self) -> None:
        for table, buffer in self._buffers.items():
            if not buffer:
                continue
            rows = buffer[:]  # list slicing and deletion are atomic under the GIL
            del buffer[: len(rows)]
            self.row_observer(table, rows)
            if not self.enabled:
                continue
            if self.schema_version == CSV_SCHEMA_VERSION:
                spec = TABLES[table]
                self._write(table, spec.file_name, format_rows(rows, spec.exact_indexes), spec.header())
            else:
                self._append_segment(table, rows)
        if self._events:
            events = self._events[:]
            del self._events[: len(events)]
            self.row_observer("events", events)  # dicts, not rows: the loggers show problems as they happen
            if self.enabled:
                text = "".join(json.dumps(e, default=str) + "\n" for e in events)
                self._write("events", EVENTS_FILE, text, "")

    def _write(self, key: str, file_name: str, text: str, header: str) -> None:
        try:
            handle = self._files.get(key)
            if handle is None:
                path = self.rank_dir / file_name
                handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for appends
                if handle.tell() == 0 and header:
                    handle.write(header)
                self._files[key] = handle
            handle.write(text)
            handle.flush()
            self.bytes_written[key] = self.bytes_written.get(key, 0) + len(text)
        except OSError as exc:
            self._disable(f"cannot write traces to {self.rank_dir} ({exc}); capture is off for this rank")

    def _append_segment(self, table: str, rows: list) -> None:
        # imported (at init) only for schema 2: a CSV-writing process never loads pyarrow
        from pyarrow import ArrowException

        from diag.trace.columnar import StreamSegmentWriter

        try:
            segments = self._segments.get(table)
            if segments is None:
                segments = self._segments[table] = StreamSegmentWriter(self.rank_dir, TABLES[table])
            before = segments.bytes_written
            segments.append(rows)
            self.bytes_written[table] = self.bytes_written.get(table, 0) + segments.bytes_written - before
        except (OSError, ArrowException) as exc:
            self._disable(f"cannot write traces to {self.rank_dir} ({exc}); capture is off for this rank")

    def _write_json_atomically(self, name: str, payload: dict) -> None:
        if not self.enabled:
            return
        path = self.rank_dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")  # one per writing thread
        try:
            tmp.write_text(json.dumps(payload, indent=1, default=str))
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a full disk: no temp file left behind
                tmp.unlink()
            self._disable(f"cannot write {path} ({exc}); capture is off for this rank")

    def _drop_overflow(self, table: str) -> None:
        self.rows_dropped += 1
        alive = self._thread is not None and self._thread.is_alive()
        reason = "the trace writer stopped" if not alive else "the trace writer cannot keep up"
        warn_once(f"writer-overflow-{self.rank_dir}", f"{reason}; dropping {table} records")

    def _disable(self, message: str) -> None:
        if self.enabled:
            self.enabled = False
            warn_once(f"writer-disabled-{self.rank_dir}", message)
        for buffer in self._buffers.values():
            buffer.clear()
        self._events.clear()
