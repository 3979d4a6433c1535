"""Fill the gaps of the Python-side recorder from PyTorch's Flight Recorder at finish.

Some collectives are issued from C++ where no Python wrapper sees them (DDP's constructor broadcasts its
parameters and verifies their shapes). Flight Recorder's ring buffer sees every collective of a process
group; at finish the entries issued after ``diag.init`` that the recorder missed are written with source
``fr``. The ring buffer holds only the most recent entries (TORCH_FR_BUFFER_SIZE), so older gaps stay gaps.
"""

from __future__ import annotations

import pickle

_ELEMENT_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}
_DTYPE_NAMES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Int": "int32",
    "Long": "int64",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}


def dump_bytes() -> bytes | None:
    """This process's Flight Recorder dump as torch gives it (a pickle). NCCL groups record in NCCL's
    recorder on older torch, the others in the generic one: take whichever holds more."""
    import torch

    c10d = torch._C._distributed_c10d
    best = None
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump()
        except Exception:  # e.g. NCCL's recorder on a build without NCCL
            continue
        if data and (best is None or len(data) > len(best)):
            best = data
    return best


def own_dump() -> dict | None:
    """This process's Flight Recorder entries. It is our own memory, not a file, so plain unpickling is safe."""
    data = dump_bytes()
    return pickle.loads(data) if data else None


def missed_rows(dump: dict, seen: dict[str, set[int]], since_ns: int) -> list[tuple]:
    """``collectives`` rows for the dump's collectives issued since ``since_ns`` whose (pg, seq) is unseen."""
    rows = []
    for entry in dump.get("entries", []):
        if entry.get("is_p2p") or (entry.get("time_created_ns") or 0) < since_ns:
            continue
        pg = str(entry.get("process_group", ("",))[0])
        seq = int(entry.get("collective_seq_id", -1))
        if seq in seen.get(pg, ()):
            continue
        dtypes = entry.get("input_dtypes") or []
        numel = sum(_numel(size) for size in entry.get("input_sizes") or [])
        duration_ms = entry.get("duration_ms")
        rows.append(
            (
                -1,
                pg,
                seq,
                str(entry.get("profiling_name", "")).split(":")[-1],
                numel * _ELEMENT_BYTES.get(dtypes[0], 0) if dtypes else 0,
                _DTYPE_NAMES.get(dtypes[0], str(dtypes[0]).lower()) if dtypes else "",
                None,
                entry["time_created_ns"] // 1000,
                None if duration_ms is None else round(float(duration_ms) * 1000, 1),
                0,
                "fr",
            )
        )
    return rows


def _numel(size) -> int:
    count = 1
    for dim in size:
        count *= int(dim)
    return count
