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
    with open(path, "w") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        count = _write_events(out, _events(trace, steps, ranks), 0)
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


# -- a trace directory, rank by rank -------------------------------------------------------------------------------

EXPORT_TABLES = ("steps", "phases", "microbatches", "collectives", "telemetry")  # memory is not on the timeline


def write_chrome_trace_dir(
    trace_dir: Path,
    path: Path,
    steps: tuple[int, int] | None = None,
    ranks: list[int] | None = None,
    progress: bool = False,
    windowed: bool = True,
) -> tuple[int, list[int], list]:
    """``write_chrome_trace`` of a trace directory, read one rank at a time: memory holds one rank's tables
    (and its events of the chosen steps), never the whole trace. A first pass reads every rank's manifest (to
    keep one run, as ``diag.load`` does) and, with ``steps``, its steps (the chosen steps' wall-clock span
    selects the telemetry samples); the second reads each chosen rank's tables and writes its events. Returns
    (events, ranks written, skipped).

    ``windowed`` (the default): the second pass decodes only the schema-2 row groups and record batches whose
    step (telemetry: time) range meets the window (``TableSegments.window``: Parquet statistics, a stream's
    batches), and writes the events from Arrow without pandas, so the work per rank follows the steps asked,
    not the run's length; the files the export does not show (heartbeat, events, nccl.log) are not read. A rank
    whose files hold a second run appended (its steps start again), and ``windowed=False``, go through the
    loader's pandas path (``_rank_trace``), which writes the same events."""
    from diag.trace.loader import TraceError, TraceReader

    reader = TraceReader(trace_dir, tables=("steps",) if steps is not None else ())
    rank_dirs = reader.rank_dirs()
    if not rank_dirs:
        raise TraceError(
            f"no diag traces in {trace_dir}: expected rank00000/, rank00001/, ... sub-directories written by diag.init"
        )
    chosen = {r: d for r, d in rank_dirs.items() if ranks is None or r in set(ranks)}
    skipped = list(reader._dir_notes)
    with _bar(progress, len(rank_dirs) + len(chosen), "exporting ranks") as tick:
        others, window_us, restarted = _first_pass(reader, rank_dirs, steps, tick, windowed)
        if others:
            skipped.append(_other_runs_note(trace_dir, others))
        written = [r for r in chosen if r not in others]
        count = 0
        full = TraceReader(trace_dir, tables=EXPORT_TABLES)
        pruned = TraceReader(trace_dir, tables=EXPORT_TABLES)
        pruned.windows = _read_windows(steps, window_us)
        with open(path, "w") as out:
            out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            for rank in written:
                if windowed and rank not in restarted:
                    events = _rank_events(pruned, full, trace_dir, rank, chosen[rank], skipped, steps, window_us)
                else:
                    trace = _rank_trace(full, trace_dir, rank, chosen[rank], skipped, steps, window_us)
                    events = _events_of_rank(trace, rank, steps, window_us)
                count = _write_events(out, events, count)
                tick()
            out.write("\n]}\n")
    return count, written, skipped


class _bar:
    """diag.progress's bar over ranks (``tick()`` per rank and pass: two passes, so twice its threshold)."""

    def __init__(self, enabled: bool, total: int, desc: str):
        from diag.progress import MIN_ITEMS, NoBar, bar

        self._bar = bar(total, desc, min_items=2 * MIN_ITEMS) if enabled else NoBar()

    def __enter__(self):
        return lambda: self._bar.update(1)

    def __exit__(self, *exc):
        self._bar.close()


def _first_pass(reader, rank_dirs: dict, steps, tick, windowed: bool = True) -> tuple[set[int], tuple | None, set]:
    """Over every rank: those of other runs than the one most ranks have (left out, as ``assemble_trace``
    does), with ``steps`` the wall-clock span of those steps over the kept ranks (``_window_us``: None when
    no rank recorded a step), and the ranks whose steps start again (a second run appended to their files: the
    loader's cut needs their files whole). A rank's steps table is read whole here (one row a step, the step,
    start and duration columns are what it needs): a second run can be anywhere in it."""
    from diag.trace.loader import _read_json
    from diag.trace.schema import MANIFEST_FILE

    run_ids, spans, restarted = {}, {}, set()
    for rank, rank_dir in rank_dirs.items():
        if steps is None:
            manifest = _read_json(rank_dir / MANIFEST_FILE, []) if windowed else reader._read_rank(rank, rank_dir)[0]
        else:
            reader._offsets.clear()  # each rank read once, from the start
            reader._segments.clear()
            arrow = reader.read_rank_tables(rank, rank_dir, ("steps",), []).get("steps") if windowed else None
            if windowed and not _restarted(arrow):
                manifest = _read_json(rank_dir / MANIFEST_FILE, [])
                spans[rank] = _steps_span(arrow, steps)
            else:
                if windowed:
                    restarted.add(rank)
                recorded: dict = {}
                trace = _rank_trace(reader, reader.path, rank, rank_dir, [], steps, recorded=recorded)
                manifest = {"run_id": trace.run_id}
                chosen = _select(trace.steps, steps, {rank})
                if not recorded.get("steps"):
                    spans[rank] = None  # no steps recorded
                elif chosen.empty:
                    spans[rank] = ()  # steps, none of them chosen
                else:
                    spans[rank] = (
                        float(chosen["start_us"].min()),
                        float((chosen["start_us"] + chosen["duration_us"]).max()),
                    )
        run_id = (manifest or {}).get("run_id")
        run_ids[rank] = run_id if isinstance(run_id, str) and run_id else None
        tick()
    counts = pd.Series([v for v in run_ids.values() if v is not None], dtype="object").value_counts()
    kept = counts.index[0] if len(counts) else None
    others = {r for r, v in run_ids.items() if v is not None and v != kept} if len(counts) > 1 else set()
    window_us = None
    kept_spans = [s for r, s in spans.items() if s is not None and r not in others]
    if kept_spans:  # some rank recorded steps: the span of the chosen ones, (0, 0) when none was chosen
        found = [s for s in kept_spans if s]
        window_us = (min(s[0] for s in found), max(s[1] for s in found)) if found else (0.0, 0.0)
    return others, window_us, restarted


def _steps_span(arrow, steps) -> tuple | None:
    """A rank's chosen steps' wall-clock span from its steps as read (Arrow; no second run in them), as the
    pandas path finds it: None without steps, () when none is chosen; rows with an insane duration left out."""

    from diag.trace.loader import MAX_DURATION_US

    if arrow is None or not arrow.num_rows:
        return None
    step, start, duration = (arrow.column(c).to_numpy() for c in ("step", "start_us", "duration_us"))
    chosen = (duration >= 0) & (duration <= MAX_DURATION_US) & (step >= steps[0]) & (step < steps[1])
    if not chosen.any():
        return ()
    return float(start[chosen].min()), float((start[chosen] + duration[chosen]).max())


def _other_runs_note(trace_dir: Path, others: set[int]):
    from diag.trace.loader import Skipped

    return Skipped(str(trace_dir), f"ranks {sorted(others)} belong to other runs; left out")


def _rank_trace(
    reader, trace_dir: Path, rank: int, rank_dir: Path, skipped: list, steps=None, window_us=None, recorded=None
):
    """One rank's tables (those ``reader`` reads) as a Trace, with the loader's checks of a rank's own rows
    (insane durations, an earlier run appended to the same files). With ``steps``, only the rows of those
    steps (and the telemetry samples in ``window_us``) are converted: the rest is dropped while still in
    Arrow, so the work per rank follows the steps asked. ``recorded``: gets each table's rows as read."""
    from diag.trace.loader import assemble_trace, to_frame
    from diag.trace.schema import TABLES

    reader._offsets.clear()  # each rank read once, from the start; nothing kept of ranks already written
    reader._segments.clear()
    manifest, heartbeat, tables, events, rank_skipped, _ = reader._read_rank(rank, rank_dir)
    if recorded is not None:
        recorded.update({name: arrow.num_rows for name, arrow in tables.items()})
    if steps is not None and not _restarted(tables.get("steps")):
        # no second run appended to the files (which the loader cuts by the steps' times): the window can be
        # taken before the conversion, with _select's and _telemetry's own predicates
        tables = {name: _in_window(name, arrow, steps, window_us) for name, arrow in tables.items()}
    data = {name: _empty(name) for name in TABLES}
    for name, arrow in tables.items():
        data[name] = to_frame([arrow], TABLES[name], rank_column=True)
    data.update(
        manifests=[] if manifest is None else [manifest],
        heartbeats=pd.DataFrame(),
        events=pd.DataFrame(),
        skipped=rank_skipped,
        ranks=[rank],
        nccl_logs={},
    )
    trace = assemble_trace(trace_dir, data)
    skipped.extend(trace.skipped)
    return trace


def _restarted(steps_arrow) -> bool:
    """Step numbers that do not strictly increase: a second run appended to the same files (as
    ``latest_run_cuts`` finds them)."""
    import numpy as np

    if steps_arrow is None or steps_arrow.num_rows < 2:
        return False
    numbers = steps_arrow.column("step").to_numpy(zero_copy_only=False)
    return bool((np.diff(numbers) <= 0).any())


def _in_window(name: str, arrow, steps, window_us):
    import pyarrow.compute as pc

    if name == "telemetry":
        if window_us is None:
            return arrow
        time_us = arrow.column("time_us")
        keep = pc.and_(pc.greater_equal(time_us, window_us[0]), pc.less_equal(time_us, window_us[1]))
    elif "step" in arrow.column_names:
        step = arrow.column("step")
        keep = pc.and_(pc.greater_equal(step, steps[0]), pc.less(step, steps[1]))
    else:
        return arrow
    return arrow.filter(pc.fill_null(keep, False))


_EMPTY: dict = {}


def _empty(name: str) -> pd.DataFrame:
    """An empty table of ``name`` (building one costs ~8 ms, column by column: once, then copied)."""
    from diag.trace.loader import empty_table
    from diag.trace.schema import TABLES

    if name not in _EMPTY:
        _EMPTY[name] = empty_table(TABLES[name])
    return _EMPTY[name].copy()


def _events_of_rank(trace, rank: int, steps, window_us) -> Iterator[dict]:
    offsets = trace.clock_offsets_us()
    wanted = {rank}
    yield from _metadata(trace, wanted)
    for name, frame in (("steps", trace.steps), ("phases", trace.phases), ("pipeline", trace.microbatches)):
        yield from _spans(name, _select(frame, steps, wanted), offsets)
    yield from _collectives(_select(trace.collectives, steps, wanted), offsets)
    yield from _telemetry(trace.telemetry, window_us, offsets)


# -- the windowed path: one rank's rows of the chosen steps, from Arrow -----------------------------------------

STEP_TABLES = ("steps", "phases", "microbatches", "collectives")


def _read_windows(steps, window_us) -> dict:
    """``TraceReader.windows`` for the chosen steps: the step tables by their step (``A <= step < B``, integers:
    ``B - 1`` inclusive), telemetry by its sample time within the steps' span (when one was found)."""
    if steps is None:
        return {}
    windows = {name: ("step", steps[0], steps[1] - 1) for name in STEP_TABLES}
    if window_us is not None:
        windows["telemetry"] = ("time_us", window_us[0], window_us[1])
    return windows


def _rank_events(pruned, full, trace_dir: Path, rank: int, rank_dir: Path, skipped: list, steps, window_us):
    """One rank's events, as ``_events_of_rank`` of ``_rank_trace`` gives them: its tables read by ``pruned``
    (the window's row groups and batches only), the window's rows kept exactly, then the loader's checks of a
    rank's rows (insane durations dropped, the manifest's notes), events written straight from Arrow. Without
    ``steps`` (whole tables), a rank whose steps start again goes through ``_rank_trace`` with ``full``."""
    from diag.trace.loader import _read_json
    from diag.trace.schema import MANIFEST_FILE

    pruned._offsets.clear()  # each rank read once, from the start; nothing kept of ranks already written
    pruned._segments.clear()
    notes: list = []
    manifest = _read_json(rank_dir / MANIFEST_FILE, notes)
    tables = pruned.read_rank_tables(rank, rank_dir, EXPORT_TABLES, notes)
    if steps is None and _restarted(tables.get("steps")):
        return _events_of_rank(_rank_trace(full, trace_dir, rank, rank_dir, skipped), rank, None, None)
    if steps is not None:
        tables = {name: _in_window(name, arrow, steps, window_us) for name, arrow in tables.items()}
    tables = _sane_durations(tables, notes, trace_dir)
    parsed = _rank_manifest(trace_dir, rank, manifest, notes)
    skipped.extend(notes)
    return _arrow_events(rank, parsed, tables)


def _sane_durations(tables: dict, skipped: list, trace_dir: Path) -> dict:
    """The loader's ``_drop_insane_durations`` on one rank's Arrow tables (same rows dropped, same notes)."""
    import numpy as np

    from diag.trace.loader import insane_durations, insane_durations_note
    from diag.trace.schema import TABLES

    out = dict(tables)
    for name in TABLES:
        arrow = tables.get(name)
        if arrow is None or not arrow.num_rows or "duration_us" not in arrow.column_names:
            continue
        # nulls (unfinished collectives) become NaN, which insane_durations keeps
        bad = insane_durations(arrow.column("duration_us").to_numpy().astype("float64"))
        if bad.any():
            out[name] = arrow.filter(~bad)
            skipped.append(insane_durations_note(name, int(np.count_nonzero(bad)), trace_dir))
    return out


def _rank_manifest(trace_dir: Path, rank: int, manifest: dict | None, skipped: list):
    """The rank's parsed Manifest (None without one), with the notes ``assemble_trace`` gives a one-rank trace."""
    from diag.trace.loader import checked_manifests
    from diag.trace.memory_deep import read_memory_deep

    manifests, _ = checked_manifests(
        [] if manifest is None else [{**manifest, "rank": rank}], [rank], skipped, trace_dir
    )
    read_memory_deep(trace_dir, [rank], skipped)
    return manifests.get(rank)


def _arrow_events(rank: int, manifest, tables: dict) -> Iterator[dict]:
    """``_events_of_rank``'s events, in its order, from one rank's Arrow tables (already cut to the window): the
    same names, times and args (every column, nulls as None, as ``_args`` gives them from pandas)."""
    offset = manifest.clock_offset_us if manifest is not None and manifest.clock_offset_us is not None else 0.0
    host = (manifest.host if manifest else None) or "?"
    yield {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({host})"}}
    yield {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}
    for track, tid in TRACKS.items():
        yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}}
    for kind, name in (("steps", "steps"), ("phases", "phases"), ("pipeline", "microbatches")):
        for row in _rows(tables.get(name)):
            yield {
                "ph": "X",
                "pid": rank,
                "tid": TRACKS[kind],
                "ts": row["start_us"] - offset,
                "dur": float(row["duration_us"]),
                "name": _row_span_name(kind, row),
                "args": row,
            }
    yield from _arrow_collectives(list(_rows(tables.get("collectives"))), rank, offset)
    for row in _rows(tables.get("telemetry")):
        for column, label in TELEMETRY_COUNTERS.items():
            value = row[column]
            if value is not None:
                yield {
                    "ph": "C",
                    "pid": rank,
                    "ts": row["time_us"] - offset,
                    "name": f"GPU {row['gpu']} {label}",
                    "args": {label: float(value)},
                }


def _arrow_collectives(rows: list[dict], rank: int, offset: float) -> Iterator[dict]:
    groups = {pg: 10 + i for i, pg in enumerate(sorted({_text(row["pg"]) for row in rows}))}
    for pg, tid in groups.items():
        yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": f"collectives pg {pg}"}}
    for row in rows:
        duration = row["duration_us"]
        yield {
            "ph": "X",
            "pid": rank,
            "tid": groups[_text(row["pg"])],
            "ts": row["start_us"] - offset,
            "dur": 0.0 if duration is None else float(duration),  # never completed: a zero-length mark
            "name": f"{_text(row['op'])} #{row['seq']}",
            "args": row,
        }


def _rows(arrow) -> Iterator[dict]:
    """Each row as {column: value}, in the columns' order (the rank first), nulls as None."""
    if arrow is None or not arrow.num_rows:
        return
    names = arrow.column_names
    for values in zip(*(_values(arrow.column(name)) for name in names)):
        yield dict(zip(names, values))


def _values(column) -> list:
    """A column's values as Python objects, nulls as None, as ``to_pylist`` gives them (which builds an Arrow
    scalar per value: ~5x slower, half of writing a whole run's events): numbers through numpy, a dictionary
    column's codes looked up in its dictionary, chunk by chunk. A column with nulls: ``to_pylist``."""
    import pyarrow as pa

    if column.null_count:
        return column.to_pylist()
    if not pa.types.is_dictionary(column.type):
        return column.to_numpy().tolist()
    out: list = []
    for chunk in column.chunks:
        words = chunk.dictionary.to_pylist()
        out.extend(words[code] for code in chunk.indices.to_numpy().tolist())
    return out


def _text(value) -> str:
    """A category value as pandas prints it: a missing one (NaN in a categorical) is "nan"."""
    return "nan" if value is None else str(value)


def _row_span_name(kind: str, row: dict) -> str:
    if kind == "steps":
        return f"step {row['step']}"
    if kind == "phases":
        return _text(row["name"])
    return f"{_text(row['action'])} mb{row['microbatch']}"


# one encoder for every event: json.dumps with options builds a new JSONEncoder per call (~10% of writing a run)
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _write_events(out, events: Iterator[dict], count: int) -> int:
    for event in events:
        try:
            text = _ENCODE(event)
        except ValueError:  # inf/nan from a damaged row: JSON has no Infinity, and Perfetto rejects the file
            text = _ENCODE(_finite(event))
        out.write((",\n" if count else "") + text)
        count += 1
    return count
