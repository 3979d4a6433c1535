"""A parquet cache of loaded traces, so analysing a large directory a second time skips the CSV parsing.

The cache lives in ``TRACE_DIR/.diag-cache/<key>/`` where the key hashes the name, size and modification time
of every file in every rank directory: any change (a run still being written, a rank added, a file edited)
gives a new key, and the stale entry is removed when the new one is written. When the trace directory is
read-only the cache goes to the system temp directory instead; if that fails too, there is no cache and the
trace is simply loaded. A cache that cannot be read is ignored and rebuilt: it is never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from diag.trace.loader import RANK_DIR_RE, Skipped, Trace, TraceError, load
from diag.trace.schema import TABLES

CACHE_DIR = ".diag-cache"
CACHE_FORMAT = 1  # bump when what is stored changes
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


def cache_roots(path: Path) -> list[Path]:
    """Where a cache for ``path`` may live: next to the traces, else in the temp directory."""
    key = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    return [path / CACHE_DIR, Path(tempfile.gettempdir()) / "diag-cache" / key]


def load_cached(path: str | Path, progress: bool = False, cache: bool = True) -> tuple[Trace, str]:
    """Load ``path`` through the cache. Returns the trace and how: "cache", "loaded+cached" or "loaded"."""
    path = Path(path)
    if not cache or not path.is_dir():
        return load(path, progress=progress), "loaded"
    key = signature(path)
    for root in cache_roots(path):
        trace = _read(root / key, path)
        if trace is not None:
            return trace, "cache"
    trace = load(path, progress=progress)
    for root in cache_roots(path):
        if _write(root, key, trace):
            return trace, "loaded+cached"
    return trace, "loaded"


def _read(entry: Path, path: Path) -> Trace | None:
    meta_path = entry / _META
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        tables = {name: pq.read_table(entry / f"{name}.parquet").to_pandas() for name in TABLES}
    except (OSError, ValueError, pa.ArrowException):
        return None
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


def _write(root: Path, key: str, trace: Trace) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        return False
    try:
        for name in TABLES:
            frame: pd.DataFrame = getattr(trace, name)
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp / f"{name}.parquet", compression="lz4")
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
        os.replace(tmp, root / key)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    _remove_stale(root, keep=key)
    return True


def _remove_stale(root: Path, keep: str) -> None:
    for entry in root.iterdir():
        if entry.name != keep:
            shutil.rmtree(entry, ignore_errors=True)


def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if value is pd.NA:
        return None
    return str(value)


__all__ = ["load_cached", "signature", "cache_roots", "TraceError"]
