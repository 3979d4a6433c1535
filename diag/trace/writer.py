"""Append-only writer of one rank's trace files, flushed by a background thread.

The training thread only appends tuples to in-memory lists (a few hundred nanoseconds); formatting and I/O
happen on the writer thread every ``flush_interval_s``, so a rank killed with SIGKILL loses at most that
much. Any I/O error (unwritable directory, full disk) stops the writer with one warning: records are dropped
from then on and nothing is ever raised into the caller. The stop itself is recorded (``on_stop``, then
``write_last_words``): a small reserve file, deleted at the stop, leaves room on a full disk for the manifest and
heartbeat to say that capture stopped, so that the report does not read the rows that made it as the whole run.

Files are opened without following symbolic links, and a rank directory that is a symbolic link is refused: a
link planted in a shared trace directory must not make capture write into its target.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diag._warn import warn_once
from diag.trace.schema import (
    CSV_SCHEMA_VERSION,
    EVENTS_FILE,
    HEARTBEAT_FILE,
    MANIFEST_FILE,
    SCHEMA_VERSION,
    TABLES,
    earlier_heartbeat_name,
    earlier_heartbeat_number,
)

TRACE_FORMATS = (CSV_SCHEMA_VERSION, SCHEMA_VERSION)  # 1: CSV tables; 2: Arrow stream segments compacted to Parquet
# What capture writes unless asked: schema 2 (docs/trace-format.md says why it became the default);
# diag.init(trace_format=1) still writes CSV
DEFAULT_TRACE_FORMAT = SCHEMA_VERSION

# Rows kept in memory at most while the writer thread is behind or dead; beyond this they are dropped.
MAX_BUFFERED_ROWS = 500_000
# Room kept on the trace's disk for the manifest and heartbeat that say capture stopped (each a few KiB)
RESERVE_FILE = ".capture-reserve"
RESERVE_BYTES = 64 * 1024
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


def _keep_earlier_heartbeat(rank_dir: Path) -> None:
    """A restart into this directory: keep the earlier attempt's last heartbeat under the next attempt number
    before this attempt's first heartbeat replaces it (how that attempt ended is told only there)."""
    try:
        names = os.listdir(rank_dir)
        if HEARTBEAT_FILE not in names:
            return
        numbers = [earlier_heartbeat_number(name) for name in names]
        number = max((n for n in numbers if n is not None), default=0) + 1
        os.rename(rank_dir / HEARTBEAT_FILE, rank_dir / earlier_heartbeat_name(number))
    except OSError as exc:
        warn_once("writer-earlier-heartbeat", f"an earlier attempt's heartbeat in {rank_dir} is not kept ({exc})")


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
        self.stop_reason: str | None = None  # why capture stopped mid-run ("disk full"), None while it runs
        # told once, with the short reason, when a write fails mid-run (the session records where it stopped)
        self.on_stop: Callable[[str], None] = _ignore_reason
        self._pid = os.getpid()  # a forked child never writes or flushes the parent's rows
        self._reserved = False  # the reserve file is ours to delete (never through a refused link)
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
        _WRITERS.add(self)  # a forked child drops what it inherited (_forget_in_child)
        self.row_observer: Callable[[str, list], None] = _ignore_rows
        # called on the writer's thread before each timed flush: rows that wait on something outside the
        # training thread (a GPU span's CUDA events) are resolved there, so they reach the files and the live
        # metrics within a flush interval even when the training loop has stopped or hangs
        self.before_flush: Callable[[], None] = _nothing
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True)
            refuse_symlinked_dir(self.rank_dir)
            _keep_earlier_heartbeat(self.rank_dir)
            _write_new_file(self.rank_dir / RESERVE_FILE, bytes(RESERVE_BYTES))
            self._reserved = True
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
        if not self.enabled or not self.in_owner_process():
            return None
        path = self.rank_dir / name
        try:
            _write_new_file(path, text.encode("utf-8"), truncate=True)
            return path
        except OSError as exc:
            self._disable(f"cannot write {path} ({exc}); capture is off for this rank", exc)
            return None

    def in_owner_process(self) -> bool:
        """False in a process forked from the rank (a DataLoader worker, a user's ``os.fork``): it inherited
        the buffers, and writing them would put the parent's rows in the parent's files twice."""
        return os.getpid() == self._pid

    def write_last_words(self, manifest: dict, heartbeat: dict | None) -> None:
        """After a stop: the manifest and heartbeat that say so, written once more despite the stop. The
        reserve file goes first, so that a full disk has room for them; a directory that refuses new files
        (read-only, immutable) still lets the existing files be rewritten in place."""
        if self._reserved:
            with contextlib.suppress(OSError):
                os.unlink(self.rank_dir / RESERVE_FILE)
        for name, payload in ((MANIFEST_FILE, manifest), (HEARTBEAT_FILE, heartbeat)):
            if payload is None:
                continue
            text = json.dumps(payload, indent=1, default=str)
            try:
                self._replace_json(name, text)
            except OSError:
                try:
                    _write_in_place(self.rank_dir / name, text.encode("utf-8"))
                except OSError as exc:
                    warn_once(
                        f"writer-last-words-{self.rank_dir}",
                        f"cannot record in {self.rank_dir / name} that capture stopped ({exc})",
                    )

    def flush(self) -> None:
        if not self.in_owner_process():
            return
        with self._lock:
            started = time.thread_time()
            try:
                self._flush_locked()
            finally:
                self.flush_s += time.thread_time() - started

    def close(self) -> None:
        if not self.in_owner_process():
            return
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
        if self._reserved:
            with contextlib.suppress(OSError):
                os.unlink(self.rank_dir / RESERVE_FILE)

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
                self._disable(f"trace writer failed ({exc!r}); capture is off for this rank", exc)
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
                fd = os.open(self.rank_dir / file_name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NO_FOLLOW, 0o644)
                handle = open(fd, "a", encoding="utf-8")  # noqa: SIM115 - kept open for appends
                if handle.tell() == 0 and header:
                    handle.write(header)
                self._files[key] = handle
            handle.write(text)
            handle.flush()
            self.bytes_written[key] = self.bytes_written.get(key, 0) + len(text)
        except OSError as exc:
            self._disable(f"cannot write traces to {self.rank_dir} ({exc}); capture is off for this rank", exc)

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
            self._disable(f"cannot write traces to {self.rank_dir} ({exc}); capture is off for this rank", exc)

    def _write_json_atomically(self, name: str, payload: dict) -> None:
        if not self.enabled or not self.in_owner_process():
            return
        try:
            self._replace_json(name, json.dumps(payload, indent=1, default=str))
        except OSError as exc:
            self._disable(f"cannot write {self.rank_dir / name} ({exc}); capture is off for this rank", exc)

    def _replace_json(self, name: str, text: str) -> None:
        self.replace_file(name, text.encode("utf-8"))

    def replace_file(self, name: str, data: bytes) -> None:
        """Write a whole file atomically (a temporary file renamed over it); raises OSError."""
        path = self.rank_dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")  # one per writing thread
        try:
            _write_new_file(tmp, data)
            os.replace(tmp, path)  # replaces a planted link itself, never writes through it
        except OSError:
            with contextlib.suppress(OSError):  # a full disk: no temp file left behind
                tmp.unlink()
            raise

    def _drop_overflow(self, table: str) -> None:
        self.rows_dropped += 1
        alive = self._thread is not None and self._thread.is_alive()
        reason = "the trace writer stopped" if not alive else "the trace writer cannot keep up"
        warn_once(f"writer-overflow-{self.rank_dir}", f"{reason}; dropping {table} records")

    def _disable(self, message: str, error: BaseException | None = None) -> None:
        was_enabled, self.enabled = self.enabled, False
        for buffer in self._buffers.values():
            buffer.clear()
        self._events.clear()
        if not was_enabled:
            return
        started = self._thread is not None  # after init: a stop mid-run, which the trace must say
        if started:
            self.stop_reason = stop_reason(error)
            message = f"capture stopped: {message}"
        warn_once(f"writer-disabled-{self.rank_dir}", message)
        if started:
            try:
                self.on_stop(self.stop_reason)
            except Exception as exc:
                warn_once(f"writer-on-stop-{self.rank_dir}", f"cannot record that capture stopped ({exc!r})")


def _forget_in_child() -> None:
    """In a forked child: every writer stops, silently, and drops the rows it inherited. They are the parent's,
    which writes them; the child's own steps (a user's ``os.fork`` inside a step) are not the rank's."""
    for writer in list(_WRITERS):
        writer.enabled = False
        for buffer in writer._buffers.values():
            buffer.clear()
        writer._events.clear()


_WRITERS: weakref.WeakSet[RankWriter] = weakref.WeakSet()
os.register_at_fork(after_in_child=_forget_in_child)


def stop_reason(error: BaseException | None) -> str:
    """A short reason for the report: "disk full", "trace directory not writable", else the error."""
    number = getattr(error, "errno", None)
    if number in (errno.ENOSPC, errno.EDQUOT):
        return "disk full"
    if number in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "trace directory not writable"
    if number == errno.ELOOP:
        return "symbolic link in the trace directory"
    return repr(error)[:200] if error is not None else "trace writer failed"


def refuse_symlinked_dir(path: Path) -> None:
    """OSError(ELOOP) when the rank directory itself is a symbolic link: writing into whatever it points to
    would let anyone who can create it in a shared trace directory direct capture's files."""
    if path.is_symlink():
        raise OSError(errno.ELOOP, "the rank directory is a symbolic link; diag does not write through it", str(path))


def _write_new_file(path: Path, data: bytes, truncate: bool = False) -> None:
    """Write ``data`` to ``path`` without following a symbolic link planted there (O_NOFOLLOW: ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | _NO_FOLLOW | (os.O_TRUNC if truncate else os.O_EXCL)
    if not truncate:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale reserve left by a killed run
    fd = os.open(path, flags, 0o644)
    with open(fd, "wb") as handle:
        handle.write(data)


def _write_in_place(path: Path, data: bytes) -> None:
    """Rewrite an existing file's contents (no new directory entry: works in a directory that refuses them)."""
    fd = os.open(path, os.O_WRONLY | _NO_FOLLOW)
    with open(fd, "wb") as handle:
        handle.write(data)
        handle.truncate()


def _ignore_reason(reason: str) -> None:
    pass
