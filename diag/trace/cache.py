"""A cache of loaded traces (Arrow IPC files, zstd-compressed), so analysing a large directory a second time skips the CSV parsing.

The cache lives in ``TRACE_DIR/.diag-cache/<key>/`` where the key hashes the name, size and modification time
of every file in every rank directory: any change (a run still being written, a rank added, a file edited)
gives a new key, and the stale entry is removed when the new one is written. Results computed from a
trace (an analysis report for given options) are kept in the same entry, so they go stale with it. When the
trace directory is not writable the cache goes to the user's own cache directory (``$XDG_CACHE_HOME/diag`` or
``~/.cache/diag``); if that fails too, there is no cache and the trace is simply loaded. A cache that cannot be
read is ignored and rebuilt: it is never a reason to fail.

Nothing in a cache is trusted that another user could have put there: a cache directory is used only when it
is a real directory (never a symbolic link) owned by the user running diag, and it is made private (0700);
a stale entry is removed only when it is such a directory with a cache key's name, and what is read back is
checked before use (anything odd is a cache miss). So a link or a report planted by someone else, next to
the traces or in the user's cache, is neither followed, deleted through, nor served.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather

from diag.trace.loader import RANK_DIR_RE, Skipped, Trace, TraceError, load
from diag.trace.manifest import parse_manifests
from diag.trace.nccl_log import NcclLog
from diag.trace.schema import TABLES, Table

CACHE_DIR = ".diag-cache"
CACHE_FORMAT = 7  # bump when what is stored changes (3: parsed NCCL logs; 4: memory and telemetry columns added;
# 5: memory_deep.json's contents; 6: the manifests' hang settings and group timeouts; 7: steps.runqueue_wait_us)
_META = "meta.json"
_ENTRY_NAME_RE = re.compile(r"^\.?[0-9a-f]{32}(-[A-Za-z0-9_]+)?$")  # a signature, or a half-written entry
_META_KEYS = ("manifests", "events", "heartbeats", "skipped", "world_size", "ranks_found", "ranks_missing", "run_id")


def signature(path: Path) -> str:
    """Hash of (file name, size, mtime) for every file of every rank directory under ``path``."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"format={CACHE_FORMAT}".encode())
    with os.scandir(path) as entries:
        rank_dirs = sorted(e.name for e in entries if e.is_dir() and RANK_DIR_RE.match(e.name))
    for name in rank_dirs:
        with os.scandir(path / name) as files:
            for entry in sorted(files, key=lambda e: e.name):
                if entry.is_file():
                    stat = entry.stat()
                    digest.update(f"{name}/{entry.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def user_cache_dir() -> Path | None:
    """The user's own cache directory for diag (XDG), or None when neither XDG_CACHE_HOME nor HOME is set.
    Never a shared, predictable path such as the system temp directory."""
    base = os.environ.get("XDG_CACHE_HOME") or (
        os.path.join(os.environ["HOME"], ".cache") if os.environ.get("HOME") else None
    )
    return Path(base) / "diag" if base and os.path.isabs(base) else None


def cache_roots(path: Path) -> list[Path]:
    """Where a cache for ``path`` may live: next to the traces, else in the user's own cache directory."""
    key = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    user = user_cache_dir()
    return [path / CACHE_DIR] + ([user / "traces" / key] if user is not None else [])


def private_dir(path: Path, create: bool) -> bool:
    """Whether ``path`` is a directory diag may trust: a real directory (not a link) owned by this user, made
    0700. With ``create``, missing directories are made (0700) first. Checked on an O_NOFOLLOW handle, so the
    path cannot be swapped for a link between the check and the chmod."""
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # missing, a link, or not a directory
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class TraceCache:
    """The cache entry of one trace directory as it is now: its loaded tables, and results computed from them
    (JSON, by name: e.g. an analysis report for a given set of options), all keyed on the files' signature."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.key = signature(self.path)
        self.roots = cache_roots(self.path)

    def load(self, progress: bool = False) -> tuple[Trace, str]:
        """The trace, from the cache when there; how: "cache", "loaded+cached" or "loaded"."""
        for entry in self._trusted_entries():
            trace = _read(entry, self.path)
            if trace is not None:
                return trace, "cache"
        trace = load(self.path, progress=progress)
        for root in self.roots:
            if _write(root, self.key, trace):
                return trace, "loaded+cached"
        return trace, "loaded"

    def _trusted_entries(self):
        """This trace's cache entries that diag may read: in a trusted root, themselves trusted."""
        for root in self.roots:
            if private_dir(root, create=False) and private_dir(root / self.key, create=False):
                yield root / self.key

    def get_result(self, name: str) -> dict | None:
        """A stored result, or None: missing, unreadable, not a JSON object, or in an untrusted place."""
        for entry in self._trusted_entries():
            try:
                payload = json.loads(_read_regular_file(entry / f"{name}.json"))
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(payload, dict) and payload:
                return payload
        return None

    def put_result(self, name: str, payload: dict, create: bool = False) -> bool:
        """``create``: make this trace's entry when there is none (diag analyze --partitioned caches its report
        without the tables, which it never loads whole); it is keyed like any entry, so it goes stale with it."""
        text = json.dumps(payload, default=_json_default)
        if create and not any(True for _ in self._trusted_entries()):
            for root in self.roots:
                if private_dir(root, create=True) and private_dir(root / self.key, create=True):
                    _remove_stale(root, keep=self.key)
                    break
        for entry in self._trusted_entries():  # only next to a cached trace, so stale results go with it
            try:
                tmp = entry / f".{name}.json.tmp"
                tmp.write_text(text)
                os.replace(tmp, entry / f"{name}.json")
                return True
            except OSError:
                continue
        return False


def load_cached(path: str | Path, progress: bool = False, cache: bool = True) -> tuple[Trace, str]:
    """Load ``path`` through the cache. Returns the trace and how: "cache", "loaded+cached" or "loaded"."""
    path = Path(path)
    if not cache or not path.is_dir():
        return load(path, progress=progress), "loaded"
    return TraceCache(path).load(progress=progress)


def _read_regular_file(path: Path) -> str:
    """A file's text, refusing links, FIFOs and devices (which could block or never end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "r", encoding="utf-8", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def _valid_meta(meta) -> bool:
    if not isinstance(meta, dict) or any(key not in meta for key in _META_KEYS):
        return False
    lists = ("manifests", "events", "heartbeats", "skipped", "ranks_found", "ranks_missing")
    return all(isinstance(meta[key], list) for key in lists) and isinstance(meta["world_size"], int | None)


def _read(entry: Path, path: Path) -> Trace | None:
    """The cached trace of ``entry``, or None for anything missing, unreadable or malformed (rebuilt then)."""
    try:
        meta = json.loads(_read_regular_file(entry / _META))
        if not _valid_meta(meta):
            return None
        tables = {name: _read_table(entry / f"{name}.arrow", TABLES[name]) for name in TABLES}
        return _trace_from(meta, tables, path)
    except Exception:  # a bad cache is never a reason to fail: whatever it raises, the trace is loaded anew
        return None


def _trace_from(meta: dict, tables: dict, path: Path) -> Trace:
    return Trace(
        path=path,
        **tables,
        manifests=parse_manifests(meta["manifests"], []),  # checked when first loaded: no notes again
        events=pd.DataFrame(meta["events"]),
        heartbeats=pd.DataFrame(meta["heartbeats"]),
        skipped=[Skipped(**s) for s in meta["skipped"]],
        world_size=meta["world_size"],
        ranks_found=meta["ranks_found"],
        ranks_missing=meta["ranks_missing"],
        run_id=meta["run_id"],
        nccl_logs={int(rank): NcclLog.from_json(log) for rank, log in (meta.get("nccl_logs") or {}).items()},
        memory_deep={
            int(rank): data for rank, data in (meta.get("memory_deep") or {}).items() if isinstance(data, dict)
        },
    )


def _read_table(path: Path, table: Table) -> pd.DataFrame:
    """Column by column, straight to the schema's dtypes: much faster than ``Table.to_pandas`` on tens of
    millions of rows, which rebuilds pandas' metadata and consolidates blocks."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise OSError(f"{path} is not a regular file")
    arrow = feather.read_table(path, memory_map=False)
    dtypes = {"rank": "int32", **table.dtypes}
    columns = {}
    for name in arrow.column_names:
        nullable = {"Int64": pd.Int64Dtype(), "Float64": pd.Float64Dtype()}.get(dtypes.get(name, ""))
        mapper = (lambda _t, dtype=nullable: dtype) if nullable is not None else None
        columns[name] = arrow.column(name).to_pandas(types_mapper=mapper)
    del arrow
    frame = pd.DataFrame(columns, copy=False)
    for name, dtype in dtypes.items():
        if name in frame and str(frame[name].dtype) != dtype:
            frame[name] = frame[name].astype(dtype)
    return frame


def _write(root: Path, key: str, trace: Trace) -> bool:
    if not private_dir(root, create=True):
        return False
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        return False
    try:
        for name in TABLES:
            frame: pd.DataFrame = getattr(trace, name)
            arrow = pa.Table.from_pandas(frame, preserve_index=False)
            feather.write_feather(arrow, tmp / f"{name}.arrow", compression="zstd", compression_level=1)
        meta = {
            "manifests": [m.to_json() for m in trace.manifests.values()],
            "events": trace.events.to_dict("records"),
            "heartbeats": trace.heartbeats.to_dict("records"),
            "skipped": [{"path": s.path, "reason": s.reason, "lines": s.lines} for s in trace.skipped],
            "world_size": trace.world_size,
            "ranks_found": [int(r) for r in trace.ranks_found],
            "ranks_missing": [int(r) for r in trace.ranks_missing],
            "run_id": None if trace.run_id is None else str(trace.run_id),
            "nccl_logs": {str(rank): log.to_json() for rank, log in trace.nccl_logs.items()},
            "memory_deep": {str(rank): data for rank, data in trace.memory_deep.items()},
        }
        (tmp / _META).write_text(json.dumps(meta, default=_json_default))
        os.replace(tmp, root / key)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        shutil.rmtree(tmp, ignore_errors=True)
        return private_dir(root / key, create=False)  # another process may have written the same entry first
    _remove_stale(root, keep=key)
    return True


def _remove_stale(root: Path, keep: str) -> None:
    """Remove the other entries of ``root``: only real directories of this user with a cache entry's name.
    A link is never followed or deleted through, and nothing else in the directory is touched.
    (``shutil.rmtree`` does not follow links inside the tree: ``rmtree.avoids_symlink_attacks`` on Linux.)"""
    uid = os.geteuid()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if entry.name == keep or not _ENTRY_NAME_RE.match(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            shutil.rmtree(entry.path, ignore_errors=True)


def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if value is pd.NA:
        return None
    return str(value)


__all__ = ["TraceCache", "load_cached", "signature", "cache_roots", "user_cache_dir", "TraceError"]
