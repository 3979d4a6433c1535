"""A cache of loaded traces (Arrow IPC files, zstd-compressed), so analysing a large directory a second time skips the CSV parsing.

The cache lives in ``TRACE_DIR/.diag-cache/<key>/`` where the key hashes the name, size and modification time
of every file in every rank directory: any change (a run still being written, a rank added, a file edited)
gives a new key, and the stale entry is removed when the new one is written. Results computed from a
trace (an analysis report for given options) are kept in the same entry, so they go stale with it. When the trace directory is
read-only the cache goes to the user's own cache directory instead ($XDG_CACHE_HOME/diag or ~/.cache/diag,
mode 0700; never a shared, predictable /tmp path another user could plant links or reports in); if that fails
too, there is no cache and the trace is simply loaded.

Safety: a cache root or entry is used only when it is a real directory (not a symlink) owned by this user;
stale entries are removed only when they are real directories we own (``os.lstat``, and ``shutil.rmtree``'s
fd-based walk, which never follows links); what is read back is checked for shape. A cache that is missing,
damaged, planted or unreadable is a cache miss, recomputed: it is never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather

from diag.trace.loader import RANK_DIR_RE, Skipped, Trace, TraceError, load
from diag.trace.schema import TABLES, Table

CACHE_DIR = ".diag-cache"
CACHE_FORMAT = 2  # bump when what is stored changes
_META = "meta.json"


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


def user_cache_dir() -> Path:
    """The per-user fallback: $XDG_CACHE_HOME/diag, else ~/.cache/diag (never a shared /tmp path)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec says a relative value is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diag"


def cache_roots(path: Path) -> list[Path]:
    """Where a cache for ``path`` may live: next to the traces, else in the user's own cache directory."""
    key = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    return [path / CACHE_DIR, user_cache_dir() / key]


def _is_own_dir(path: Path) -> bool:
    """A real directory (not a link to one) owned by this user: the only kind the cache reads, writes or deletes."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _is_own_file(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()


def _private_root(root: Path) -> bool:
    """Create ``root`` (0700) if needed; True only when it is a real directory we own and nobody else can write."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    if not _is_own_dir(root):
        return False
    if os.lstat(root).st_mode & 0o022:  # group/world-writable: others could plant entries
        try:
            os.chmod(root, 0o700, follow_symlinks=False)
        except (OSError, NotImplementedError):
            return False
    return True


class TraceCache:
    """The cache entry of one trace directory as it is now: its loaded tables, and results computed from them
    (JSON, by name: e.g. an analysis report for a given set of options), all keyed on the files' signature."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.key = signature(self.path)
        self.roots = cache_roots(self.path)

    def load(self, progress: bool = False) -> tuple[Trace, str]:
        """The trace, from the cache when there; how: "cache", "loaded+cached" or "loaded"."""
        for root in self.roots:
            trace = _read(root / self.key, self.path)
            if trace is not None:
                return trace, "cache"
        trace = load(self.path, progress=progress)
        for root in self.roots:
            if _write(root, self.key, trace):
                return trace, "loaded+cached"
        return trace, "loaded"

    def get_result(self, name: str) -> dict | None:
        """A stored result, or None when absent, unreadable, planted through a link or not a JSON object
        (e.g. ``{}`` or ``[]`` left by a damaged write): the caller recomputes."""
        for root in self.roots:
            entry = root / self.key
            path = entry / f"{name}.json"
            if not (_is_own_dir(root) and _is_own_dir(entry) and _is_own_file(path)):
                continue
            try:
                payload = json.loads(path.read_text())
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(payload, dict) and payload:
                return payload
        return None

    def put_result(self, name: str, payload: dict) -> bool:
        text = json.dumps(payload, default=_json_default)
        for root in self.roots:
            entry = root / self.key
            if not (_is_own_dir(root) and _is_own_dir(entry)):
                continue  # only next to a cached trace, so stale results go when the trace entry is replaced
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


_META_SHAPE = {
    "manifests": list,
    "events": list,
    "heartbeats": list,
    "skipped": list,
    "ranks_found": list,
    "ranks_missing": list,
}


def _read(entry: Path, path: Path) -> Trace | None:
    """The cached trace, or None (a miss) when the entry is absent, a link, not ours, or of the wrong shape."""
    meta_path = entry / _META
    if not (_is_own_dir(entry.parent) and _is_own_dir(entry) and _is_own_file(meta_path)):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if not _meta_ok(meta):
            return None
        tables = {}
        for name in TABLES:
            if not _is_own_file(entry / f"{name}.arrow"):
                return None
            tables[name] = _read_table(entry / f"{name}.arrow", TABLES[name])
        return Trace(
            path=path,
            **tables,
            manifests=pd.DataFrame(meta["manifests"]),
            events=pd.DataFrame(meta["events"]),
            heartbeats=pd.DataFrame(meta["heartbeats"]),
            skipped=[Skipped(**s) for s in meta["skipped"]],
            world_size=meta["world_size"],
            ranks_found=meta["ranks_found"],
            ranks_missing=meta["ranks_missing"],
            run_id=meta["run_id"],
        )
    except (OSError, ValueError, TypeError, KeyError, RecursionError, pa.ArrowException):
        return None  # anything odd in what we read back is a miss: the trace is loaded again


def _meta_ok(meta) -> bool:
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k), t) for k, t in _META_SHAPE.items()):
        return False
    if not all(isinstance(s, dict) for s in meta["skipped"]):
        return False
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in meta["ranks_found"] + meta["ranks_missing"]):
        return False
    world_size = meta.get("world_size")
    return (world_size is None or (isinstance(world_size, int) and world_size > 0)) and "run_id" in meta


def _read_table(path: Path, table: Table) -> pd.DataFrame:
    """Column by column, straight to the schema's dtypes: much faster than ``Table.to_pandas`` on tens of
    millions of rows, which rebuilds pandas' metadata and consolidates blocks."""
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
    if not _private_root(root):
        return False  # a link, someone else's directory, or not creatable: no cache here
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
            "manifests": trace.manifests.to_dict("records"),
            "events": trace.events.to_dict("records"),
            "heartbeats": trace.heartbeats.to_dict("records"),
            "skipped": [{"path": s.path, "reason": s.reason, "lines": s.lines} for s in trace.skipped],
            "world_size": trace.world_size,
            "ranks_found": [int(r) for r in trace.ranks_found],
            "ranks_missing": [int(r) for r in trace.ranks_missing],
            "run_id": None if trace.run_id is None else str(trace.run_id),
        }
        (tmp / _META).write_text(json.dumps(meta, default=_json_default))
        if os.path.lexists(root / key) and not _is_own_dir(root / key):
            raise OSError(f"{root / key} is not our directory")  # a planted link or file: never replace through it
        os.replace(tmp, root / key)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        shutil.rmtree(tmp, ignore_errors=True)
        return _is_own_dir(root / key)  # another process may have written the same entry first
    _remove_stale(root, keep=key)
    return True


def _remove_stale(root: Path, keep: str) -> None:
    """Remove old entries: only real directories we own inside a root we own; links and foreign files stay."""
    if not _is_own_dir(root):
        return
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        entry = root / name
        if name != keep and _is_own_dir(entry):
            shutil.rmtree(entry, ignore_errors=True)  # fd-based on Linux: does not follow links inside


def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if value is pd.NA:
        return None
    return str(value)


__all__ = ["TraceCache", "load_cached", "signature", "cache_roots", "TraceError"]
