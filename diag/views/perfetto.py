"""All ranks on one timeline in the Chrome trace event format, which ui.perfetto.dev and chrome://tracing open.

One process per rank (pid = rank, named with its host), and in it: a track of steps with their phases nested
inside (phases recorded only as a duration are laid out in order, and say so), one per process group for
collectives (each drawn for its measured duration, or an estimate marked as one, and linked to the same
collective on the other ranks by a flow), pipeline micro-batches, and GPU telemetry as counters. Each rank's
times are moved onto rank 0's clock with its manifest's ``clock_offset_us``, so that collectives line up across
hosts. The file is written event by event: a large run never has to fit in memory as JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

# tids within a rank's process: the step track holds each step and its phases nested inside it; collectives get
# COLLECTIVE_TID + LANES_PER_GROUP x their group's index + a lane (collectives of one group that overlap in time)
STEP_TID = 1
PIPELINE_TID = 3
COLLECTIVE_TID = 10
LANES_PER_GROUP = 1000
TELEMETRY_COUNTERS = {
    "util_pct": "GPU utilisation %",
    "sm_clock_mhz": "SM clock MHz",
    "power_w": "power W",
    "temp_c": "temperature C",
}
# the step's phases recorded only as durations (steps table columns), in the order a training step runs them
STEP_PHASES = (
    ("data wait", "data_wait_us"),
    ("forward", "forward_us"),
    ("backward", "backward_us"),
    ("optimizer", "optimizer_us"),
)
LAID_OUT = "laid out in order"  # args.start of a phase whose start was not recorded
MIN_DRAWN_US = 1.0  # a collective narrower than this (an estimate of 0) is drawn this wide, its args say so


def write_chrome_trace(trace, path: Path, steps: tuple[int, int] | None = None, ranks: list[int] | None = None) -> int:
    """Write ``trace`` (steps ``A <= step < B`` and ``ranks`` when given) to ``path``; returns the event count."""
    wanted = sorted(set(ranks) if ranks is not None else set(trace.ranks_found))
    window_us = _window_us(trace, steps)
    data = {rank: _trace_rank_data(trace, rank, steps, window_us) for rank in wanted}
    instances = CollectiveInstances()
    for rank, rank_data in data.items():
        instances.add_rank(rank, rank_data.offset_us, rank_data.rows["collectives"])
    instances.finish()
    with open(path, "w") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        count = 0
        for rank, rank_data in data.items():
            count = _write_events(out, rank_events(rank, rank_data, instances), count)
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


@dataclass
class RankData:
    """One rank's rows of the window, table by table, each row {column: value} (nulls as None): what its events
    are made of, whichever way the rows were read (a loaded Trace, or Arrow straight from its files)."""

    host: str
    offset_us: float  # the rank's clock minus rank 0's
    rows: dict[str, list[dict]]


def _trace_rank_data(trace, rank: int, steps, window_us) -> RankData:
    manifest = trace.manifest(rank)
    rows = {}
    for name, frame in (
        ("steps", trace.steps),
        ("phases", trace.phases),
        ("microbatches", trace.microbatches),
        ("collectives", trace.collectives),
    ):
        rows[name] = [_args(row) for row in _select(frame, steps, {rank}).itertuples(index=False)]
    telemetry = trace.telemetry[trace.telemetry["rank"] == rank]
    if window_us is not None:
        inside = (telemetry["time_us"] >= window_us[0]) & (telemetry["time_us"] <= window_us[1])
        telemetry = telemetry[inside]
    rows["telemetry"] = [_args(row) for row in telemetry.itertuples(index=False)]
    host = (manifest.host if manifest else None) or "?"
    return RankData(host, trace.clock_offsets_us().get(rank, 0.0), rows)


def _args(row) -> dict:
    return {k: (None if pd.isna(v) else v.item() if hasattr(v, "item") else v) for k, v in row._asdict().items()}


# -- collectives across ranks: one instance per (group, seq) ------------------------------------------------------


@functools.cache
def _canonical_op(op: str) -> str:
    """``comms.canonical_op``, once per op name (it is asked once per collective row)."""
    from diag.analysis.comms import canonical_op

    return canonical_op(op)


def _matched(op: str, seq) -> bool:
    """Whether rows of this op and seq on different ranks are one instance (as ``collective_waits.RankPart`` matches
    them: point to point ops are numbered per rank, and an unknown seq (-1) matches nothing)."""
    return seq is not None and seq >= 0 and _canonical_op(op) not in ("send", "recv")


@dataclass
class _Instance:
    op: str
    first: tuple = (math.inf, -1)  # (issue time on rank 0's clock, rank) of the first rank to issue it
    last: tuple = (-math.inf, -1)  # and of the last: the rank the others waited for
    ranks: int = 0
    latest_untimed_us: float = -math.inf  # latest issue among the rows without a duration
    transfer_us: float = math.inf  # shortest measured duration: the transfer once every rank was there
    bytes_max: int = 0


class CollectiveInstances:
    """What a rank's collective events need of the other ranks, reduced rank by rank (memory: one record per
    collective instance in the window, not per row), as diag.analysis.collective_waits defines it: who issued
    each instance first and last, the latest issue of its untimed rows, its transfer time (shortest measured
    duration), and per (op, group) the median bandwidth of the timed instances, to estimate the untimed ones."""

    def __init__(self):
        self._instances: dict[tuple[str, int], _Instance] = {}
        self._bandwidth: dict[tuple[str, str], float] = {}  # bytes per us

    def add_rank(self, rank: int, offset_us: float, rows: list[dict]) -> None:
        for row in rows:
            pg, op = _text(row["pg"]), _text(row["op"])
            if not _matched(op, row["seq"]):
                continue
            key = (pg, int(row["seq"]))
            instance = self._instances.get(key)
            if instance is None:
                instance = self._instances[key] = _Instance(op)
            ts = row["start_us"] - offset_us
            instance.first = min(instance.first, (ts, rank))
            instance.last = max(instance.last, (ts, rank))
            instance.ranks += 1
            instance.bytes_max = max(instance.bytes_max, int(row["bytes"] or 0))
            duration = row["duration_us"]
            if duration is None:
                instance.latest_untimed_us = max(instance.latest_untimed_us, ts)
            else:
                instance.transfer_us = min(instance.transfer_us, float(duration))

    def finish(self) -> None:
        """The bandwidths, once every rank was added."""
        rates: dict[tuple[str, str], list[float]] = {}
        for (pg, _), instance in self._instances.items():
            if math.isfinite(instance.transfer_us) and instance.transfer_us > 0 and instance.bytes_max > 0:
                rates.setdefault((_canonical_op(instance.op), pg), []).append(instance.bytes_max / instance.transfer_us)
        self._bandwidth = {key: statistics.median(sorted(values)) for key, values in rates.items()}

    def get(self, pg: str, seq) -> _Instance | None:
        return self._instances.get((pg, int(seq))) if seq is not None else None

    def bandwidth_bytes_per_us(self, op: str, pg: str) -> float | None:
        return self._bandwidth.get((_canonical_op(op), pg))


@functools.lru_cache(maxsize=1 << 16)  # each instance is asked once per rank
def flow_id(pg: str, seq: int) -> str:
    """The flow that links one instance's slices on every rank: the same on every rank without any of them
    knowing the others' (hex: Perfetto reads a string bind_id as a hexadecimal number)."""
    return hashlib.blake2b(f"{pg}\x1f{seq}".encode(), digest_size=8).hexdigest()


def _flow(instance: _Instance | None, pg: str, seq, rank: int, ts: float) -> dict:
    """The v2 flow fields (``bind_id`` with ``flow_in``/``flow_out`` on the slice itself) of a rank's slice of an
    instance: one chain through its ranks in the order they issued it, ending at the last rank to arrive.

    Why this shape: a flow on the slice binds to that slice exactly (no separate "s"/"f" event to place inside
    it) and adds no event, so the file grows by a few fields per collective; Perfetto reads the events in time
    order, so a chain must follow the issue times (a flow step before its start is dropped), and in that order
    every arrow points forward in time and the chain ends at the rank everyone waited for. A star from the
    last rank would need that rank's slice to carry one flow per other rank (one bind_id per slice), and each
    rank's events to know every other rank's: a chain needs only who issued first and last."""
    if instance is None or instance.ranks < 2:
        return {}
    first, last = instance.first == (ts, rank), instance.last == (ts, rank)
    fields = {"bind_id": flow_id(pg, int(seq))}
    if not first:
        fields["flow_in"] = True
    if not last:
        fields["flow_out"] = True
    return fields


def _collective_duration(row: dict, ts: float, instance: _Instance | None, instances: CollectiveInstances):
    """(drawn duration, args to add) of a collective row: its measured duration, else an estimate from the
    other ranks' records: the wait for the last rank to issue it (issue times, on rank 0's clock) plus the
    transfer (the shortest duration measured on another rank, else the bytes at the median bandwidth of the
    timed collectives of the same op and group). Without either, the wait alone: a lower bound."""
    measured = row["duration_us"]
    if measured is not None:
        extra = {"duration": "measured"}
        if instance is not None:
            extra["last_rank_to_issue"] = instance.last[1]
        if measured < MIN_DRAWN_US:
            extra["drawn_us"] = MIN_DRAWN_US
        return max(float(measured), MIN_DRAWN_US), extra
    op, pg = _text(row["op"]), _text(row["pg"])
    wait_us = max(0.0, instance.latest_untimed_us - ts) if instance is not None else 0.0
    transfer_us, transfer = None, f"unknown (no timed {op} in group {pg}): the estimate is a lower bound"
    if instance is not None and math.isfinite(instance.transfer_us):
        transfer_us, transfer = instance.transfer_us, "the shortest duration measured on another rank"
    else:
        bandwidth = instances.bandwidth_bytes_per_us(op, pg)
        if bandwidth:
            nbytes = instance.bytes_max if instance is not None else int(row["bytes"] or 0)
            transfer_us = nbytes / bandwidth
            transfer = f"{nbytes} bytes at the median bandwidth of the timed {op} in group {pg} ({bandwidth:.1f} MB/s)"
    estimated_us = wait_us + (transfer_us or 0.0)
    extra = {
        "duration": "estimated",
        "estimated_us": round(estimated_us, 1),
        "wait_us": round(wait_us, 1),  # until the last rank issued it, from the issue times on rank 0's clock
        "transfer": transfer,
    }
    if instance is not None:
        extra["last_rank_to_issue"] = instance.last[1]
    if estimated_us < MIN_DRAWN_US:
        extra["drawn_us"] = MIN_DRAWN_US
    return max(estimated_us, MIN_DRAWN_US), extra


# -- one rank's events ----------------------------------------------------------------------------------------


def rank_events(rank: int, data: RankData, instances: CollectiveInstances) -> Iterator[dict]:
    """Every event of one rank: its process and tracks named, its steps with their phases nested inside, its
    pipeline micro-batches, its collectives (measured or estimated, linked across ranks) and GPU counters."""
    offset = data.offset_us
    rows = data.rows
    yield {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({data.host})"}}
    yield {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}
    yield from _thread(rank, STEP_TID, "steps and phases")
    yield from _step_events(rank, rows["steps"], rows["phases"], offset)
    if rows["microbatches"]:
        yield from _thread(rank, PIPELINE_TID, "pipeline")
    for row in rows["microbatches"]:
        yield {
            "ph": "X",
            "cat": "pipeline",
            "pid": rank,
            "tid": PIPELINE_TID,
            "ts": row["start_us"] - offset,
            "dur": float(row["duration_us"]),
            "name": f"{_text(row['action'])} mb{row['microbatch']}",
            "args": row,
        }
    yield from _collective_events(rank, rows["collectives"], offset, instances)
    for row in rows["telemetry"]:
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


def _thread(rank: int, tid: int, name: str) -> Iterator[dict]:
    yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}
    yield {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}}


def _step_events(rank: int, steps: list[dict], phases: list[dict], offset: float) -> Iterator[dict]:
    """Each step as a span from its data wait (spent before the body, in the loader) to the end of its body,
    and inside it, on the same track, its phases: those with a recorded start where they ran, and the phases the
    steps table has only as a duration (data wait, forward, backward, optimizer; the sum of their calls in the
    step) laid out one after the other in that order, in the time the timed phases leave free."""
    timed: dict[int, list[dict]] = {}
    for row in phases:
        timed.setdefault(row["step"], []).append(row)
    in_steps = set()
    previous_end = -math.inf
    for row in sorted(steps, key=lambda r: r["start_us"]):
        step, body_ts = row["step"], row["start_us"] - offset
        end = body_ts + float(row["duration_us"])
        # from its data wait, but not before the previous step's end (a data wait spent inside a body)
        start = max(body_ts - float(row["data_wait_us"] or 0), min(previous_end, body_ts))
        previous_end = max(previous_end, end)
        yield {
            "ph": "X",
            "cat": "step",
            "pid": rank,
            "tid": STEP_TID,
            "ts": start,
            "dur": end - start,
            "name": f"step {step}",
            "args": {**row, "span": "data wait + step body"},
        }
        own = [p for p in timed.get(step, []) if start <= p["start_us"] - offset <= end]
        in_steps.update(id(p) for p in own)
        yield from _timed_phases(rank, own, offset, end)
        yield from _laid_out_phases(rank, row, own, offset, start, body_ts, end)
    for row in phases:  # outside any step of the window (step -1): where they ran, at the top of the track
        if id(row) not in in_steps:
            yield from _timed_phases(rank, [row], offset, math.inf)


def _timed_phases(rank: int, rows: list[dict], offset: float, end: float) -> Iterator[dict]:
    for row in rows:
        ts = row["start_us"] - offset
        # inside its step: host clocks round apart
        yield _phase_span(rank, ts, min(float(row["duration_us"]), end - ts), _text(row["name"]), row)


def _phase_span(rank: int, ts: float, dur: float, name: str, args: dict) -> dict:
    return {"ph": "X", "cat": "phase", "pid": rank, "tid": STEP_TID, "ts": ts, "dur": dur, "name": name, "args": args}


def _laid_out_phases(rank: int, step: dict, timed: list[dict], offset, start, body_ts, end) -> Iterator[dict]:
    """The duration-only phases of ``step``, each placed at the first free time after the previous one that holds
    it (free: not in a timed phase, whose real time wins), cut at the step's end if it does not fit; a phase
    the step also has timed rows of is shown by those."""
    busy = sorted((p["start_us"] - offset, p["start_us"] - offset + float(p["duration_us"])) for p in timed)
    names = {_text(p["name"]) for p in timed}
    cursor = start
    for name, column in STEP_PHASES:
        duration_us = float(step[column] or 0)
        if duration_us <= 0 or name in names:
            continue
        if column == "data_wait_us" and body_ts - start >= duration_us:  # before the body (diag.wrap_loader)
            ts, drawn_us = start, duration_us
        else:  # in the body (a data wait that does not fit before it: the loader was waited on inside the step)
            ts = _free_at(max(cursor, body_ts), duration_us, busy, end)
            if ts is None:
                continue  # no free time left in the step: its duration is still in the step's args
            drawn_us = min(duration_us, _free_until(ts, busy, end) - ts)
        args = {"step": step["step"], "duration_us": step[column], "start": LAID_OUT}
        if drawn_us < duration_us:
            args["drawn_us"] = drawn_us
        yield _phase_span(rank, ts, drawn_us, name, args)
        cursor = ts + drawn_us


def _free_at(cursor: float, duration_us: float, busy: list[tuple], end: float) -> float | None:
    """The first time from ``cursor`` that starts a free stretch holding ``duration_us`` (else the first free
    time at all), before ``end``."""
    first_free = None
    while cursor < end:
        inside = [b for b in busy if b[0] <= cursor < b[1]]
        if inside:
            cursor = max(b[1] for b in inside)
            continue
        first_free = cursor if first_free is None else first_free
        free_end = _free_until(cursor, busy, end)
        if free_end - cursor >= duration_us or free_end >= end:
            return cursor if free_end - cursor >= duration_us else first_free
        cursor = free_end  # a timed phase starts here: past it next
    return first_free


def _free_until(ts: float, busy: list[tuple], end: float) -> float:
    return min([b[0] for b in busy if b[0] > ts] + [end])


def _collective_events(rank: int, rows: list[dict], offset: float, instances: CollectiveInstances) -> Iterator[dict]:
    """One track per process group (more when its collectives overlap in time: asynchronous ones, so that every
    slice nests), each collective drawn for its measured or estimated duration and linked to its instance on the
    other ranks."""
    groups = {pg: COLLECTIVE_TID + LANES_PER_GROUP * i for i, pg in enumerate(sorted({_text(r["pg"]) for r in rows}))}
    events, lane_ends = [], {}
    for row in sorted(rows, key=lambda r: (r["start_us"], _text(r["pg"]), r["seq"])):
        pg, op, seq = _text(row["pg"]), _text(row["op"]), row["seq"]
        ts = row["start_us"] - offset
        instance = instances.get(pg, seq) if _matched(op, seq) else None
        dur, extra = _collective_duration(row, ts, instance, instances)
        ends = lane_ends.setdefault(pg, [])
        lane = next((i for i, lane_end in enumerate(ends) if lane_end <= ts), len(ends))
        lane = min(lane, LANES_PER_GROUP - 1)
        if lane == len(ends):
            ends.append(ts + dur)
        else:
            ends[lane] = max(ends[lane], ts + dur)
        estimated = extra["duration"] == "estimated"
        events.append(
            {
                "ph": "X",
                "cat": "collective,estimated" if estimated else "collective",
                "pid": rank,
                "tid": groups[pg] + lane,
                "ts": ts,
                "dur": dur,
                "name": f"{op} #{seq}" + (" (estimated)" if estimated else ""),
                "args": {**row, **extra},
                **_flow(instance, pg, seq, rank, ts),
            }
        )
    for pg, tid in groups.items():
        for lane in range(len(lane_ends.get(pg, []))):
            yield from _thread(rank, tid + lane, f"collectives pg {pg}" + (f" (overlapping {lane})" if lane else ""))
    yield from events


# -- a trace directory, rank by rank -------------------------------------------------------------------------------

EXPORT_TABLES = ("steps", "phases", "microbatches", "collectives", "telemetry")  # memory is not on the timeline
COLLECTIVE_TABLES = ("steps", "collectives")  # the steps: a second run appended to a rank's files is cut by them


def write_chrome_trace_dir(
    trace_dir: Path,
    path: Path,
    steps: tuple[int, int] | None = None,
    ranks: list[int] | None = None,
    progress: bool = False,
    windowed: bool = True,
    require_events: bool = False,
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
    loader's pandas path (``_rank_trace``), which writes the same events.

    ``require_events``: a file that would hold only the ranks' names (no step, collective or counter of the chosen
    ranks in the chosen steps: manifests alone, a window past the run's end) is removed and a ``TraceError``
    raised, as ``diag analyze`` has nothing to analyse there."""
    from diag.trace.loader import TraceError, TraceReader

    reader = TraceReader(trace_dir, tables=("steps",) if steps is not None else ())
    rank_dirs = reader.rank_dirs()
    if not rank_dirs:
        raise TraceError(
            f"no diag traces in {trace_dir}: expected rank00000/, rank00001/, ... sub-directories written by diag.init"
        )
    chosen = {r: d for r, d in rank_dirs.items() if ranks is None or r in set(ranks)}
    skipped = reader.dir_notes()
    with _bar(progress, len(rank_dirs) + 2 * len(chosen), "exporting ranks") as tick:
        others, window_us, restarted = _first_pass(reader, rank_dirs, steps, tick, windowed)
        if others:
            skipped.append(_other_runs_note(trace_dir, others))
        written = [r for r in chosen if r not in others]

        def rank_data(rank: int, tables: tuple, notes: list) -> RankData:
            if windowed and rank not in restarted:
                pruned = TraceReader(trace_dir, tables=tables)
                pruned.windows = _read_windows(steps, window_us)
                return _arrow_rank_data(pruned, trace_dir, rank, chosen[rank], notes, steps, window_us)
            trace = _rank_trace(tables, trace_dir, rank, chosen[rank], notes, steps, window_us)
            return _trace_rank_data(trace, rank, steps, window_us)

        # the collectives of every rank first, reduced to one record per instance: what each rank's collective
        # events need of the others (estimates, flows). Their notes are those the second read gives again.
        instances = CollectiveInstances()
        for rank in written:
            data = rank_data(rank, COLLECTIVE_TABLES, [])
            instances.add_rank(rank, data.offset_us, data.rows["collectives"])
            tick()
        instances.finish()
        count, shown = 0, [0]

        def counted(events: Iterator[dict]) -> Iterator[dict]:
            for event in events:
                shown[0] += event.get("ph") != "M"
                yield event

        with open(path, "w") as out:
            out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            for rank in written:
                events = rank_events(rank, rank_data(rank, EXPORT_TABLES, skipped), instances)
                count = _write_events(out, counted(events), count)
                tick()
            out.write("\n]}\n")
    if require_events and not shown[0]:
        path.unlink(missing_ok=True)
        where = "in the --steps window " if steps is not None else ""
        raise TraceError(
            f"nothing to export from {trace_dir}: no step, collective or telemetry sample of "
            f"the {len(written)} rank(s) chosen {where}(manifests only, or a window outside the run)"
        )
    return count, written, skipped


class _bar:
    """diag.progress's bar over ranks (``tick()`` per rank and pass: three passes, so three times its threshold)."""

    def __init__(self, enabled: bool, total: int, desc: str):
        from diag.progress import MIN_ITEMS, NoBar, bar

        self._bar = bar(total, desc, min_items=3 * MIN_ITEMS) if enabled else NoBar()

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
    from diag.trace.loader import TraceReader, read_json
    from diag.trace.schema import MANIFEST_FILE

    run_ids, spans, restarted = {}, {}, set()
    for rank, rank_dir in rank_dirs.items():
        if steps is None:
            manifest = read_json(rank_dir / MANIFEST_FILE, [])
        else:
            own = TraceReader(reader.path, ("steps",))  # each rank read once, from the start, by a reader of its own
            arrow = own.read_rank_tables(rank, rank_dir, ("steps",), []).get("steps") if windowed else None
            if windowed and not _restarted(arrow):
                manifest = read_json(rank_dir / MANIFEST_FILE, [])
                spans[rank] = _steps_span(arrow, steps)
            else:
                if windowed:
                    restarted.add(rank)
                recorded: dict = {}
                trace = _rank_trace(reader.tables, reader.path, rank, rank_dir, [], steps, recorded=recorded)
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
    from diag.trace.loader import insane_durations

    if arrow is None or not arrow.num_rows:
        return None
    step, start, duration = (arrow.column(c).to_numpy() for c in ("step", "start_us", "duration_us"))
    chosen = ~insane_durations(duration) & (step >= steps[0]) & (step < steps[1])
    if not chosen.any():
        return ()
    return float(start[chosen].min()), float((start[chosen] + duration[chosen]).max())


def _other_runs_note(trace_dir: Path, others: set[int]):
    from diag.trace.loader import Skipped

    return Skipped(str(trace_dir), f"ranks {sorted(others)} belong to other runs; left out")


def _rank_trace(
    tables: tuple, trace_dir: Path, rank: int, rank_dir: Path, skipped: list, steps=None, window_us=None, recorded=None
):
    """One rank's ``tables`` as a Trace, with the loader's checks of a rank's own rows (insane durations, an
    earlier run appended to the same files). With ``steps``, only the rows of those steps (and the telemetry
    samples in ``window_us``) are converted: the rest is dropped while still in Arrow, so the work per rank
    follows the steps asked. ``recorded``: gets each table's rows as read."""
    from diag.trace.loader import TraceReader, assemble_trace, to_frame
    from diag.trace.schema import TABLES

    read = TraceReader(trace_dir, tables=tables).read_rank(rank, rank_dir)  # a reader of its own: from the start
    tables = read.tables
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
        manifests=[] if read.manifest is None else [read.manifest],
        heartbeats=pd.DataFrame(),
        events=pd.DataFrame(),
        skipped=read.skipped,
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


def _arrow_rank_data(pruned, trace_dir: Path, rank: int, rank_dir: Path, skipped: list, steps, window_us):
    """One rank's RankData, as ``_trace_rank_data`` of ``_rank_trace`` gives it: its tables read by ``pruned``
    (the window's row groups and batches only), the window's rows kept exactly, then the loader's checks of a
    rank's rows (insane durations dropped, the manifest's notes), rows taken straight from Arrow. Without
    ``steps`` (whole tables), a rank whose steps start again goes through ``_rank_trace``."""
    from diag.trace.loader import clean_rank_tables, read_json
    from diag.trace.schema import MANIFEST_FILE

    notes: list = []
    manifest = read_json(rank_dir / MANIFEST_FILE, notes)
    tables = pruned.read_rank_tables(rank, rank_dir, pruned.tables, notes)
    if steps is None and _restarted(tables.get("steps")):
        return _trace_rank_data(_rank_trace(pruned.tables, trace_dir, rank, rank_dir, skipped), rank, None, None)
    if steps is not None:
        tables = {name: _in_window(name, arrow, steps, window_us) for name, arrow in tables.items()}
    tables, dropped = clean_rank_tables(tables)
    notes += dropped.insane_notes(trace_dir)
    parsed = _rank_manifest(trace_dir, rank, manifest, notes)
    skipped.extend(notes)
    offset = parsed.clock_offset_us if parsed is not None and parsed.clock_offset_us is not None else 0.0
    host = (parsed.host if parsed else None) or "?"
    rows = {name: list(_rows(tables.get(name))) for name in EXPORT_TABLES}
    return RankData(host, offset, rows)


def _rank_manifest(trace_dir: Path, rank: int, manifest: dict | None, skipped: list):
    """The rank's parsed Manifest (None without one), with the notes ``assemble_trace`` gives a one-rank trace."""
    from diag.trace.loader import checked_manifests
    from diag.trace.memory_deep import read_memory_deep

    manifests, _ = checked_manifests(
        [] if manifest is None else [{**manifest, "rank": rank}], [rank], skipped, trace_dir
    )
    read_memory_deep(trace_dir, [rank], skipped)
    return manifests.get(rank)


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
