"""All ranks on one timeline in the Chrome trace event format, which ui.perfetto.dev and chrome://tracing open.

One process per rank (named with its host), one track per kind of record: steps, phases, collectives (one track
per process group), pipeline micro-batches, and GPU telemetry as counters. Each rank's times are moved onto rank
0's clock with its manifest's ``clock_offset_us``, so that collectives line up across hosts. The file is written
event by event: a large run never has to fit in memory as JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

TRACKS = {"steps": 1, "phases": 2, "pipeline": 3}  # collectives get 10 + their group's index
TELEMETRY_COUNTERS = {
    "util_pct": "GPU utilisation %",
    "sm_clock_mhz": "SM clock MHz",
    "power_w": "power W",
    "temp_c": "temperature C",
}


def write_chrome_trace(trace, path: Path, steps: tuple[int, int] | None = None, ranks: list[int] | None = None) -> int:
    """Write ``trace`` (steps ``A <= step < B`` and ``ranks`` when given) to ``path``; returns the event count."""
    count = 0
    with open(path, "w") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for event in _events(trace, steps, ranks):
            try:
                text = json.dumps(event, separators=(",", ":"), allow_nan=False)
            except ValueError:  # inf/nan from a damaged row: JSON has no Infinity, and Perfetto rejects the file
                text = json.dumps(_finite(event), separators=(",", ":"), allow_nan=False)
            out.write((",\n" if count else "") + text)
            count += 1
        out.write("\n]}\n")
    return count


def _finite(value):
    """``value`` with every non-finite float replaced by null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _events(trace, steps, ranks) -> Iterator[dict]:
    offsets = trace.clock_offsets_us()
    wanted = set(ranks) if ranks is not None else set(trace.ranks_found)
    yield from _metadata(trace, wanted)
    for name, frame in (("steps", trace.steps), ("phases", trace.phases), ("pipeline", trace.microbatches)):
        yield from _spans(name, _select(frame, steps, wanted), offsets)
    yield from _collectives(_select(trace.collectives, steps, wanted), offsets)
    yield from _telemetry(trace.telemetry[trace.telemetry["rank"].isin(wanted)], _window_us(trace, steps), offsets)


def _select(frame: pd.DataFrame, steps, ranks: set[int]) -> pd.DataFrame:
    frame = frame[frame["rank"].isin(ranks)]
    if steps is not None and "step" in frame:
        frame = frame[(frame["step"] >= steps[0]) & (frame["step"] < steps[1])]
    return frame


def _window_us(trace, steps) -> tuple[float, float] | None:
    """The wall-clock span of the chosen steps, to keep telemetry samples of that span only."""
    if steps is None or trace.steps.empty:
        return None
    chosen = _select(trace.steps, steps, set(trace.ranks_found))
    if chosen.empty:
        return (0.0, 0.0)
    return float(chosen["start_us"].min()), float((chosen["start_us"] + chosen["duration_us"]).max())


def _metadata(trace, ranks: set[int]) -> Iterator[dict]:
    for rank in sorted(ranks):
        manifest = trace.manifest(rank)
        host = (manifest.host if manifest else None) or "?"
        yield {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({host})"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}
        for track, tid in TRACKS.items():
            yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}}


def _spans(kind: str, frame: pd.DataFrame, offsets: dict[int, float]) -> Iterator[dict]:
    tid = TRACKS[kind]
    for row in frame.itertuples(index=False):
        yield {
            "ph": "X",
            "pid": int(row.rank),
            "tid": tid,
            "ts": row.start_us - offsets.get(int(row.rank), 0.0),
            "dur": float(row.duration_us),
            "name": _span_name(kind, row),
            "args": _args(row),
        }


def _span_name(kind: str, row) -> str:
    if kind == "steps":
        return f"step {row.step}"
    if kind == "phases":
        return str(row.name)
    return f"{row.action} mb{row.microbatch}"


def _collectives(frame: pd.DataFrame, offsets: dict[int, float]) -> Iterator[dict]:
    groups = {str(pg): 10 + i for i, pg in enumerate(sorted(frame["pg"].astype(str).unique()))}
    for rank in frame["rank"].unique():
        for pg, tid in groups.items():
            yield {
                "ph": "M",
                "name": "thread_name",
                "pid": int(rank),
                "tid": tid,
                "args": {"name": f"collectives pg {pg}"},
            }
    for row in frame.itertuples(index=False):
        duration = row.duration_us
        yield {
            "ph": "X",
            "pid": int(row.rank),
            "tid": groups[str(row.pg)],
            "ts": row.start_us - offsets.get(int(row.rank), 0.0),
            "dur": 0.0 if pd.isna(duration) else float(duration),  # never completed: a zero-length mark
            "name": f"{row.op} #{row.seq}",
            "args": _args(row),
        }


def _telemetry(frame: pd.DataFrame, window_us, offsets: dict[int, float]) -> Iterator[dict]:
    if window_us is not None:
        frame = frame[(frame["time_us"] >= window_us[0]) & (frame["time_us"] <= window_us[1])]
    for row in frame.itertuples(index=False):
        for column, label in TELEMETRY_COUNTERS.items():
            value = getattr(row, column)
            if not pd.isna(value):
                yield {
                    "ph": "C",
                    "pid": int(row.rank),
                    "ts": row.time_us - offsets.get(int(row.rank), 0.0),
                    "name": f"GPU {row.gpu} {label}",
                    "args": {label: float(value)},
                }


def _args(row) -> dict:
    return {k: (None if pd.isna(v) else v.item() if hasattr(v, "item") else v) for k, v in row._asdict().items()}
