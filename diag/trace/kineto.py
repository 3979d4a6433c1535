"""Read a directory of torch.profiler (Kineto) chrome traces, one JSON file per rank, into a diag ``Trace``.

Each file is streamed (``ijson`` with its C backend; gzip or plain), so memory stays a small multiple of one
rank's compact columns: no dict per event is kept, only numpy arrays and a symbol table of kernel names.
Needs no torch. What becomes what:

* ``steps``: one row per CPU ``ProfilerStep#N`` span (step = N; data wait, forward, backward and optimizer
  are not known and are 0).
* ``collectives``: one row per NCCL kernel (``ncclKernel_*`` and ``ncclDevKernel_*``: ``is_nccl_kernel``),
  with its op, process group, bytes and dtype from the kernel's args where Kineto recorded them
  (``Collective name``, ``In msg nelems``, ``dtype``, ``Process Group Name``), issued at its launch's time,
  lasting its device duration; a CPU-only trace's gloo collectives come from the ``gloo:<op>`` annotations
  of gloo's worker threads. ``seq`` numbers a group's collectives in launch order within each step
  (``step * SEQ_PER_STEP + i``), so ranks whose profiling windows differ still match up.
* ``gpu_kernels`` (only in Kineto traces): every GPU activity with a stream (kernels, memcpy, memset), its
  device interval, kind (``kernel_kind``), and the step whose ``ProfilerStep`` had last started when it was
  launched (matched through the CUDA runtime/driver call with the same ``correlation``).

The rank comes from ``distributedInfo.rank``; without it a ``rank<N>`` in the file name is used and the
report says so; without either the file is skipped, never silently called rank 0. A truncated or corrupt
file is skipped with the reason; the others are still read.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from diag.trace import json_values
from diag.trace.loader import Skipped, Trace, TraceError, empty_table
from diag.trace.manifest import parse_manifests
from diag.trace.schema import GPU_KERNELS, SCALAR_TYPES, TABLES

# The one place that decides what an NCCL kernel is: older NCCL names them ncclKernel_<Op>_..., NCCL >= 2.19
# ncclDevKernel_<Op>_... (HTA's r"^nccl.*Kernel" also matches both; a startswith("ncclKernel") would not).
NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
# Holistic Trace Analysis' definitions (hta/utils/utils.py), kept so that the two tools agree.
MEMORY_KERNEL_RE = re.compile(r"^(?:Memcpy|Memset|dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

KINDS = ("compute", "communication", "memory", "other")  # gpu_kernels.kind categories
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
SEQ_PER_STEP = 1_000_000
SUFFIXES = (".json", ".json.gz")
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d{1,15})(?!\d)")  # a step number int64 and float hold
_RANK_IN_NAME_RE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_HEAD_BYTES = 1 << 20  # "traceEvents" must appear this early for a file to count as a Kineto trace
MAX_NAME_CHARS = 64 << 10  # a kernel name kept longer than this is cut (real ones are at most a few KB)
_NAME_DTYPES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "double": "float64", "int8_t": "int8",
                "uint8_t": "uint8", "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64", "uint64_t": "uint64"}  # fmt: skip


def is_nccl_kernel(name: str) -> bool:
    return NCCL_KERNEL_RE.match(name) is not None


def kernel_kind(name: str) -> str:
    """compute, communication (NCCL), memory (memcpy, memset, dma) or other (names HTA counts as neither
    computation nor the first two, such as ``...Sync`` kernels)."""
    if is_nccl_kernel(name):
        return "communication"
    if MEMORY_KERNEL_RE.match(name):
        return "memory"
    if NOT_COMPUTE_RE.match(name):
        return "other"
    return "compute"


def _open(path: Path):
    """A regular file only: a FIFO or device named like a trace must not hang or exhaust the reader."""
    from diag.trace.loader import NotRegularFile

    handle = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")  # noqa: SIM115 - returned to the caller
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise NotRegularFile(f"{path} is not a regular file")
    return gzip.open(handle, "rb") if path.name.endswith(".gz") else handle


class _TokenSizedReader:
    """Hands the JSON parser bigger reads while it is inside one long token, so a huge string costs linear time.

    yajl re-scans a token that spans reads from its start on every read: one string of S bytes read in B-byte
    pieces costs about S^2 / B (ijson's 64 KiB reads: a 20 MB string 0.9 s, a 300 MB one over 300 s). Real
    traces have short tokens, and small reads are what parse them fastest, so a read grows (x4, up to 64 MiB)
    only while the previous one held no unescaped double quote, i.e. could not have ended a string; the next
    read holding one goes back to the base size. A quote after an escaped backslash counts as escaped: that
    only ever grows a read, which costs memory, never correctness."""

    BASE_BYTES = 64 << 10
    MAX_BYTES = 64 << 20
    _REAL_QUOTE = re.compile(rb'(?<!\\)"')
    # MAX_NESTED_OPENS containers opened in a row (short keys between them allowed): ijson builds such an event
    # whole, with a prefix string per level (50,000 levels: 6 GB and 100 s); real events nest a few levels
    # (starts with a character class so that re scans for it in C: ~4% of the parse of a real trace)
    _DEEP_RUN = re.compile(rb'[\[{](?:\s*(?:"[^"\\]{0,64}"\s*:\s*)?[\[{]){63}')

    def __init__(self, raw):
        self._raw = raw
        self._size = self.BASE_BYTES

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return self._raw.read(0)
        data = self._raw.read(self._size)
        if self._DEEP_RUN.search(data):
            raise ValueError("JSON nested deeper than 64 levels: not a trace event")
        if self._REAL_QUOTE.search(data):
            self._size = self.BASE_BYTES
        else:
            self._size = min(self._size * 4, self.MAX_BYTES)
        return data


def kineto_files(root: Path) -> list[Path]:
    """JSON files directly in ``root`` (or ``root`` itself) whose first MiB has a ``traceEvents`` key."""
    candidates = (
        [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
    )
    found = []
    for path in candidates:
        try:
            with _open(path) as handle:
                head = handle.read(_HEAD_BYTES)
        except (OSError, EOFError, zlib.error):
            head = b""
            if path.name.endswith((".pt.trace.json", ".pt.trace.json.gz")):
                found.append(path)  # named like one: let the loader say what is wrong with it
            continue
        if b'"traceEvents"' in head:
            found.append(path)
    return found


def is_kineto_dir(root: Path) -> bool:
    """A directory of Kineto traces rather than a diag trace directory (which has rankNNNNN/ directories)."""
    from diag.trace.loader import find_rank_dirs

    if not root.exists() or (root.is_dir() and find_rank_dirs(root)):
        return False
    return bool(kineto_files(root))


@dataclass
class RankEvents:
    """The compact columns kept from one rank's file."""

    path: Path
    meta: dict
    kernel_ts: array = field(default_factory=lambda: array("d"))
    kernel_dur: array = field(default_factory=lambda: array("d"))
    kernel_stream: array = field(default_factory=lambda: array("i"))
    kernel_corr: array = field(default_factory=lambda: array("q"))
    kernel_name: array = field(default_factory=lambda: array("i"))  # index into names
    names: dict = field(default_factory=dict)  # kernel name -> id
    launch_corr: array = field(default_factory=lambda: array("q"))
    launch_ts: array = field(default_factory=lambda: array("d"))
    steps: list = field(default_factory=list)  # (N, ts, dur)
    nccl: list = field(default_factory=list)  # (kernel index, op, nelems, dtype, pg)
    cpu_colls: list = field(default_factory=list)  # (op, ts, dur): gloo annotations
    odd_events: int = 0  # events left out for a value of the wrong type or out of range (said in skipped)


MAX_METADATA_DEPTH = 64  # nesting of one top-level metadata value; real traces have a handful of levels
MAX_METADATA_EVENTS = 1_000_000  # parser events in the metadata before traceEvents


def _read_metadata(handle) -> tuple[dict, bool]:
    """Top-level keys before ``traceEvents`` (cheap: Kineto writes them first); True if traceEvents was found.

    ``basic_parse`` and a depth count, not ``parse``: ``parse`` gives every event its full prefix, which for
    100 KB of nested metadata is quadratic (6 GB). Metadata nested too deep or too large is refused."""
    import ijson

    meta: dict = {}
    key, builder, depth = None, None, 0
    for seen, (event, value) in enumerate(ijson.basic_parse(_TokenSizedReader(handle), use_float=True), start=1):
        if seen > MAX_METADATA_EVENTS:
            raise ValueError(f"more than {MAX_METADATA_EVENTS} JSON values before traceEvents: not a Kineto trace")
        if event in ("start_map", "start_array"):
            depth += 1
            if depth > MAX_METADATA_DEPTH:
                raise ValueError(f"metadata nested deeper than {MAX_METADATA_DEPTH} levels")
        elif event in ("end_map", "end_array"):
            depth -= 1
        top_key = event == "map_key" and depth == 1
        if top_key or (event == "end_map" and depth == 0):
            if key is not None:
                meta[key] = builder.value
                key, builder = None, None
            if not top_key:
                return meta, False
            if value == "traceEvents":
                return meta, True
            key, builder = value, ijson.ObjectBuilder()
        elif builder is not None:
            builder.event(event, value)
    return meta, False


def read_rank_file(path: Path) -> RankEvents:
    """Stream one Kineto file into compact columns. Raises ValueError with a reason when unusable."""
    import ijson

    try:
        with _open(path) as handle:  # a cheap first read: Kineto writes the metadata before the events
            meta, has_events = _read_metadata(handle)
        if not has_events:
            raise ValueError("no traceEvents: not a torch.profiler (Kineto) trace")
        out = RankEvents(path, meta)
        with _open(path) as handle:
            _read_events(ijson.items(_TokenSizedReader(handle), "traceEvents.item", use_float=True), out)
        if "distributedInfo" not in meta:  # written after the events by some producers
            with _open(path) as handle:
                for info in ijson.items(_TokenSizedReader(handle), "distributedInfo", use_float=True):
                    meta["distributedInfo"] = info
                    break
    except (ijson.JSONError, ijson.IncompleteJSONError) as exc:
        # yajl's message spans lines (the text around the error, a caret under it): one line in a skipped list
        raise ValueError(f"corrupt or truncated JSON: {' '.join(str(exc).split())}") from exc
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"corrupt or truncated gzip: {exc}") from exc
    except OSError as exc:
        raise ValueError(f"unreadable: {exc}") from exc
    except (MemoryError, RecursionError) as exc:  # an event nested thousands of levels deep (ijson builds it whole)
        raise ValueError(f"an event nested too deep or too large to read ({type(exc).__name__})") from exc
    return out


def _read_events(events, out: RankEvents) -> None:
    """One pass over the events; per event only a few dict lookups, and appends to typed arrays."""
    k_ts, k_dur, k_stream, k_corr, k_name = (
        out.kernel_ts,
        out.kernel_dur,
        out.kernel_stream,
        out.kernel_corr,
        out.kernel_name,
    )
    l_corr, l_ts, names = out.launch_corr, out.launch_ts, out.names
    for e in events:
        try:  # free in CPython 3.11+ when nothing is raised
            cat = e.get("cat")
            if cat in GPU_CATS:
                args = e.get("args") or {}
                raw = (args.get("stream"), args.get("correlation"), e.get("ts"), e.get("dur"))
                stream, corr = _index(raw[0], MAX_STREAM), _index(raw[1], MAX_CORRELATION)
                ts, dur = _time_us(raw[2]), _time_us(raw[3])
                name = e.get("name", "")
                if stream is None or corr is None or ts is None or dur is None or dur < 0 or not isinstance(name, str):
                    # HTA too ignores GPU events without a stream or a duration: only a value that is there
                    # and wrong is counted
                    refused = _any_refused(raw, (stream, corr, ts, dur)) or (dur is not None and dur < 0)
                    out.odd_events += refused or not isinstance(name, str)
                    continue
                if len(name) > MAX_NAME_CHARS:
                    name = name[:MAX_NAME_CHARS]
                name_id = names.get(name)
                if name_id is None:
                    name_id = names[name] = len(names)
                if cat == "kernel" and is_nccl_kernel(name):
                    out.nccl.append(
                        (
                            len(k_ts),
                            args.get("Collective name"),
                            args.get("In msg nelems"),
                            args.get("dtype"),
                            args.get("Process Group Name"),
                        )
                    )
                k_ts.append(ts)
                k_dur.append(dur)
                k_stream.append(stream)
                k_corr.append(corr)
                k_name.append(name_id)
            elif cat in LAUNCH_CATS:
                args = e.get("args") or {}
                raw = (args.get("correlation"), e.get("ts"))
                corr, ts = _index(raw[0], MAX_CORRELATION), _time_us(raw[1])
                out.odd_events += _any_refused(raw, (corr, ts))
                if corr is not None and ts is not None:
                    l_corr.append(corr)
                    l_ts.append(ts)
            elif cat in ("user_annotation", "cpu_op") and e.get("ph") == "X":
                name = e.get("name", "")
                ts, dur = _time_us(e.get("ts")), _time_us(e.get("dur"))
                if not isinstance(name, str) or ts is None or dur is None or dur < 0:
                    out.odd_events += 1
                    continue
                if name.startswith("ProfilerStep"):
                    match = _STEP_RE.match(name)
                    if match:
                        out.steps.append((int(match.group(1)), ts, dur))
                elif name.startswith("gloo:"):
                    out.cpu_colls.append((name[5:MAX_NAME_CHARS], ts, dur))

        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            out.odd_events += 1  # an event of odd types (a number, a list for args): not usable


MAX_STREAM = 2**31 - 1  # the int32 stream column
MAX_CORRELATION = 2**63 - 1
MAX_TIME_US = 2**53  # microseconds a float64 holds exactly (285 years): more is not a time


def _any_refused(raw: tuple, checked: tuple) -> bool:
    """Whether a value that is there was refused by its check (a missing one is no damage)."""
    return any(value is not None and value_checked is None for value, value_checked in zip(raw, checked))


def _index(value, limit: int) -> int | None:
    """A stream or correlation id: a whole number from 0 to ``limit`` (text and floats are not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = json_values.whole(value)
    return number if number is not None and 0 <= number <= limit else None


def _time_us(value) -> float | None:
    """An event's ts or dur: a finite number of microseconds within MAX_TIME_US of 0."""
    number = json_values.finite(value)
    return number if number is not None and abs(number) <= MAX_TIME_US else None


def checked_metadata(meta: dict, path: Path, notes: list[Skipped]) -> dict:
    """The trace's top-level metadata with every value diag reads checked for type and range, once, here:
    ``distributedInfo`` a dict (its rank a rank, its world size a plausible one, its ``pg_config`` a list of
    dicts), ``deviceProperties`` a list, ``baseTimeNanoseconds`` a time, names text. What is wrong is named in
    ``notes`` and left out; the events are still read."""
    out = dict(meta)
    wrong = []
    info = meta.get("distributedInfo")
    if info is not None and not isinstance(info, dict):
        wrong.append(f"distributedInfo is a {type(info).__name__}")
    info = info if isinstance(info, dict) else {}
    checked = {}
    for key, check in (("backend", json_values.text), ("nccl_version", json_values.text)):
        if info.get(key) is not None:
            checked[key] = check(info[key])
    if "rank" in info:
        checked["rank"] = json_values.as_rank(info["rank"])
        if checked["rank"] is None:
            wrong.append(f"distributedInfo.rank {str(info['rank'])[:40]!r} is not a rank")
    if info.get("world_size") is not None:
        size = json_values.as_rank(info["world_size"])
        checked["world_size"] = size if size else None
        if not size:
            wrong.append(f"distributedInfo.world_size {str(info['world_size'])[:40]!r} is not a world size")
    pgs = info.get("pg_config")
    if pgs is not None and not isinstance(pgs, list):
        wrong.append(f"distributedInfo.pg_config is a {type(pgs).__name__}")
    checked["pg_config"] = [pg for pg in pgs if isinstance(pg, dict)] if isinstance(pgs, list) else []
    out["distributedInfo"] = {k: v for k, v in checked.items() if v is not None}
    devices = meta.get("deviceProperties")
    if devices is not None and not isinstance(devices, list):
        wrong.append(f"deviceProperties is a {type(devices).__name__}")
    out["deviceProperties"] = [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    base_ns = meta.get("baseTimeNanoseconds")
    if base_ns is not None:
        number = json_values.finite(base_ns)
        out["baseTimeNanoseconds"] = number if number is not None and 0 <= number <= MAX_TIME_US * 1e3 else None
        if out["baseTimeNanoseconds"] is None:
            wrong.append(f"baseTimeNanoseconds {str(base_ns)[:40]!r} is not a time: the trace's own clock is used")
    for key in ("host_name", "trace_id"):
        out[key] = json_values.text(meta.get(key)) if meta.get(key) is not None else None
    if wrong:
        notes.append(
            Skipped(str(path), "Kineto metadata of the wrong type or out of range, left out: " + "; ".join(wrong))
        )
    return out


def _rank_of(rank_events: RankEvents, notes: list[Skipped], only_file: bool) -> int | None:
    """The rank from distributedInfo, else from a rank<N> in the file name; the only file of a directory is rank 0
    (the usual single-GPU profile has no distributedInfo); None where several files leave it unknown."""
    rank = rank_events.meta["distributedInfo"].get("rank")  # checked_metadata: a rank or absent
    if rank is not None:
        return rank
    match = _RANK_IN_NAME_RE.search(rank_events.path.name)
    if match:
        notes.append(
            Skipped(
                str(rank_events.path),
                f"no distributedInfo.rank in the trace; rank {match.group(1)} taken from the file name",
            )
        )
        rank = json_values.as_rank(match.group(1)[:19])
        if rank is not None:
            return rank
    if only_file:
        notes.append(
            Skipped(
                str(rank_events.path),
                "no distributedInfo.rank and no rank<N> in the file name: the only trace in the directory, "
                "analysed as rank 0 of a single-process run",
            )
        )
        return 0
    return None


def load_kineto(path: str | Path) -> Trace:
    """Every rank's Kineto file in directory ``path`` as one Trace. Raises TraceError only when none is usable."""
    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root} does not exist")
    files = kineto_files(root)
    if not files:
        raise TraceError(
            f"no torch.profiler (Kineto) traces in {root}: expected *.json or *.json.gz files with traceEvents"
        )
    skipped: list[Skipped] = []
    ranks: dict[int, dict] = {}
    for file in files:
        try:
            rank_events = read_rank_file(file)
        except ValueError as exc:
            skipped.append(Skipped(str(file), f"{exc}; file skipped"))
            continue
        rank_events.meta = checked_metadata(rank_events.meta, file, skipped)
        if rank_events.odd_events:
            wrong = "a time, duration, stream, id or name of the wrong type or out of range"
            skipped.append(Skipped(str(file), f"{rank_events.odd_events} event(s) with {wrong}, left out"))
        rank = _rank_of(rank_events, skipped, only_file=len(files) == 1)
        if rank is None:
            skipped.append(
                Skipped(
                    str(file),
                    "no distributedInfo.rank and no rank<N> in the file name: which rank it is is unknown; file skipped",
                )
            )
            continue
        if rank in ranks:
            skipped.append(Skipped(str(file), f"rank {rank} already read from {ranks[rank]['path']}; file skipped"))
            continue
        ranks[rank] = _rank_tables(rank, rank_events)
        del rank_events  # only the compact tables stay
    if not ranks:
        reasons = "; ".join(str(s) for s in skipped[:5])
        raise TraceError(f"no usable torch.profiler trace in {root}: {reasons}")
    return _assemble(root, ranks, skipped)


def _rank_tables(rank: int, ev: RankEvents) -> dict:
    """Steps, collectives, GPU kernels and the manifest of one rank, as frames."""
    meta = ev.meta
    base_us = (meta.get("baseTimeNanoseconds") or 0) / 1e3  # Kineto ts are microseconds after this
    steps = sorted(ev.steps, key=lambda s: s[1])
    step_no = np.array([s[0] for s in steps], dtype="int64")
    step_ts = np.array([s[1] for s in steps], dtype="float64")
    step_dur = np.array([s[2] for s in steps], dtype="float64")

    def step_at(ts: np.ndarray) -> np.ndarray:
        """The step whose ProfilerStep had last started at ``ts`` (-1 before the first; -2 for NaN)."""
        idx = np.searchsorted(step_ts, ts, side="right") - 1
        out = np.where(idx >= 0, step_no[np.clip(idx, 0, None)] if len(step_no) else -1, -1)
        return np.where(np.isnan(ts), -2, out).astype("int64")

    kernels = _kernel_frame(rank, ev, step_at)
    steps_frame = _steps_frame(rank, step_no, step_ts, step_dur, base_us)
    collectives = _collectives_frame(rank, ev, kernels, step_at, base_us)
    return {
        "path": str(ev.path),
        "steps": steps_frame,
        "collectives": collectives,
        "kernels": kernels,
        "manifest": _manifest(rank, meta, kernels),
    }


def _kernel_frame(rank: int, ev: RankEvents, step_at) -> pd.DataFrame:
    ts = np.frombuffer(ev.kernel_ts, dtype="float64")
    dur = np.frombuffer(ev.kernel_dur, dtype="float64")
    corr = np.frombuffer(ev.kernel_corr, dtype="int64")
    launch_corr = np.frombuffer(ev.launch_corr, dtype="int64")
    launch_ts = np.frombuffer(ev.launch_ts, dtype="float64")
    order = np.argsort(launch_corr, kind="stable")
    launch_corr, launch_ts = launch_corr[order], launch_ts[order]
    pos = np.searchsorted(launch_corr, corr)
    found = pos < len(launch_corr)
    found[found] = launch_corr[pos[found]] == corr[found]
    launch = np.full(len(ts), np.nan)
    launch[found] = launch_ts[pos[found]]
    kinds_by_name = np.array([KINDS.index(kernel_kind(n)) for n in ev.names], dtype="int8")
    name_ids = np.frombuffer(ev.kernel_name, dtype="int32")
    kinds = kinds_by_name[name_ids] if len(name_ids) else np.zeros(0, dtype="int8")
    return GPU_KERNELS.frame(
        rank,
        ts_us=ts,
        end_us=ts + dur,
        stream=np.frombuffer(ev.kernel_stream, dtype="int32").copy(),
        kind=pd.Categorical.from_codes(kinds, categories=list(KINDS)),
        launch_us=launch,
        step=step_at(launch),
    )


def _steps_frame(rank, step_no, step_ts, step_dur, base_us) -> pd.DataFrame:
    frame = empty_table(TABLES["steps"])
    n = len(step_no)
    data = {"rank": np.full(n, rank, dtype="int32"), "step": step_no, "start_us": np.round(base_us + step_ts).astype("int64"),
            "duration_us": np.round(step_dur).astype("int64")}  # fmt: skip
    for name in ("data_wait_us", "forward_us", "backward_us", "optimizer_us", "comm_wait_us"):
        data[name] = np.zeros(n, dtype="int64")
    out = pd.DataFrame(data)
    for column in frame.columns:
        if column not in out:
            out[column] = pd.Series([pd.NA] * n, dtype=frame[column].dtype)
    return out[frame.columns].astype(_dtypes(frame))


def _collectives_frame(rank: int, ev: RankEvents, kernels: pd.DataFrame, step_at, base_us: float) -> pd.DataFrame:
    """NCCL kernels (GPU traces) or gloo annotations (CPU traces) as collectives rows."""
    template = empty_table(TABLES["collectives"])
    pgs = ev.meta["distributedInfo"]["pg_config"]
    default_pg = _text(pgs[0].get("pg_name", "0")) or "unknown" if len(pgs) == 1 else "unknown"
    if ev.nccl:
        index = np.array([n[0] for n in ev.nccl], dtype="int64")
        names = {v: k for k, v in ev.names.items()}
        name_ids = np.frombuffer(ev.kernel_name, dtype="int32")[index]
        ops, dtypes, nbytes, pg = [], [], [], []
        for (_, op, nelems, dtype, pg_name), name_id in zip(ev.nccl, name_ids, strict=True):
            kernel_name = names[int(name_id)]
            ops.append(_text(op) or NCCL_KERNEL_RE.match(kernel_name).group(1))
            dtype_name, size = SCALAR_TYPES.get(dtype, (None, 0)) if isinstance(dtype, str) else (None, 0)
            dtype_name = dtype_name or _dtype_from_kernel_name(kernel_name)
            dtypes.append(dtype_name or "unknown")
            count = _index(nelems, MAX_ELEMENTS)
            nbytes.append(count * size if count is not None and size else 0)
            pg.append(_text(pg_name) or default_pg)
        start = kernels["launch_us"].to_numpy()[index]
        issue = np.where(np.isnan(start), kernels["ts_us"].to_numpy()[index], start)
        duration = (kernels["end_us"].to_numpy() - kernels["ts_us"].to_numpy())[index]
        order_ts = kernels["ts_us"].to_numpy()[index]
    elif ev.cpu_colls:
        ops = [c[0] for c in ev.cpu_colls]
        issue = np.array([c[1] for c in ev.cpu_colls], dtype="float64")
        duration = np.array([c[2] for c in ev.cpu_colls], dtype="float64")
        order_ts = issue
        dtypes, nbytes, pg = ["unknown"] * len(ops), [0] * len(ops), [default_pg] * len(ops)
    else:
        return template
    step = step_at(issue)
    # seq: the i-th collective of a group within a step (launch order on the group's stream)
    keys = pd.DataFrame({"pg": pg, "step": step, "order": order_ts}).sort_values(["pg", "step", "order"], kind="stable")
    within = keys.groupby(["pg", "step"], sort=False).cumcount().sort_index().to_numpy()
    seq = np.where(step >= 0, step * SEQ_PER_STEP + within, -1)
    out = pd.DataFrame(
        {
            "rank": np.full(len(ops), rank, dtype="int32"),
            "step": step,
            "pg": pg,
            "seq": seq,
            "op": ops,
            "bytes": np.asarray(nbytes, dtype="int64"),
            "dtype": dtypes,
            "peer": pd.array([pd.NA] * len(ops), dtype="Int64"),
            "start_us": np.round(base_us + issue).astype("int64"),
            "duration_us": duration,
            "blocking": np.zeros(len(ops), dtype="int8"),
            "source": "kineto",
        }
    )
    return out[template.columns].astype(_dtypes(template))


MAX_ELEMENTS = 2**50  # elements of one collective's message: more is not a real one (int64 bytes stay exact)


def _text(value) -> str | None:
    """A name from the trace (an op, a group): text, or a whole number as its digits; None otherwise."""
    return json_values.text(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else None


def _dtypes(template: pd.DataFrame) -> dict:
    """The schema's dtypes, with plain "category" (an empty template's categories would turn values into NaN)."""
    return {c: "category" if isinstance(t, pd.CategoricalDtype) else t for c, t in template.dtypes.items()}


def _dtype_from_kernel_name(name: str) -> str | None:
    head = name.split("(", 1)[0]
    return _NAME_DTYPES.get(head.rsplit("_", 1)[-1])


def _manifest(rank: int, meta: dict, kernels: pd.DataFrame) -> dict:
    info = meta["distributedInfo"]  # checked_metadata's: values of the right types
    devices = meta["deviceProperties"]
    device_name = _text(devices[0].get("name")) if devices else None
    groups = {}
    for pg in info["pg_config"]:
        if _text(pg.get("pg_name")) is not None:  # the group's values are checked by parse_manifests
            groups[_text(pg["pg_name"])] = {
                "ranks": pg.get("ranks"),
                "size": pg.get("pg_size"),
                "backend": pg.get("backend_config"),
                "desc": pg.get("pg_desc"),
            }
    return {
        "rank": rank,
        "world_size": info.get("world_size"),
        "backend": info.get("backend"),
        "host": meta.get("host_name"),
        "device_name": device_name,
        "nccl_version": info.get("nccl_version"),
        "process_groups": groups or None,
        "source": "kineto",
        "trace_id": meta.get("trace_id"),
    }


def _assemble(root: Path, ranks: dict[int, dict], skipped: list[Skipped]) -> Trace:
    order = sorted(ranks)

    def concat(key: str, table: str) -> pd.DataFrame:
        frames = [ranks[r][key] for r in order if len(ranks[r][key])]
        if not frames:
            return empty_table(TABLES[table])
        return pd.concat(frames, ignore_index=True).astype(_dtypes(empty_table(TABLES[table])))

    kernels = pd.concat([ranks[r]["kernels"] for r in order], ignore_index=True)
    notes: list[str] = []
    manifests = parse_manifests((ranks[r]["manifest"] for r in order), notes)
    skipped.extend(Skipped(str(root), note) for note in notes)
    sizes = [m.world_size for m in manifests.values() if m.world_size is not None]
    world_size = max(max(sizes) if sizes else 0, max(order) + 1)
    return Trace(
        path=root,
        steps=concat("steps", "steps"),
        phases=empty_table(TABLES["phases"]),
        collectives=concat("collectives", "collectives"),
        memory=empty_table(TABLES["memory"]),
        telemetry=empty_table(TABLES["telemetry"]),
        microbatches=empty_table(TABLES["microbatches"]),
        calibration=empty_table(TABLES["calibration"]),
        manifests=manifests,
        events=pd.DataFrame(),
        heartbeats=pd.DataFrame(),
        skipped=skipped,
        world_size=world_size,
        ranks_found=order,
        ranks_missing=sorted(set(range(world_size)) - set(order)),
        run_id=None,
        gpu_kernels=kernels,
    )
