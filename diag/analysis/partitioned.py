"""``diag analyze`` of a trace read rank by rank, for traces of many ranks: the per-step tables loaded without
the collectives, memory and telemetry (only the columns the analyses read, the ranks read by worker processes or
the Dask cluster's workers), then the collectives' waits (diag.analysis.collective_waits) and the memory,
telemetry and health analyses run over the ranks' files by the engine, on this machine or on a Dask cluster.
``analyze_partitioned`` is the entry point; the report is ``analyze``'s of the loaded trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from diag.analysis.collective_waits import COLLECTIVES, Collectives, reduced_waits
from diag.analysis.columns import loaded_columns
from diag.analysis.comms import ReducedWaits
from diag.analysis.engine import Plan, batch_size, rank_sources, release_arrow_memory, run_two_stage
from diag.analysis.window import StepWindow
from diag.processes import Workers, contiguous_shares, release_heap_memory, worker_count
from diag.trace.loader import (
    RankRead,
    ReadNotes,
    Trace,
    TraceError,
    TraceReader,
    add_read_notes,
    assemble_trace,
    empty_table,
    gather_rank_reads,
    to_frame,
)
from diag.trace.schema import TABLES, Table

# -- memory and telemetry, analysed rank by rank on the engine ----------------------------------------------------

RANK_TABLES = ("memory", "telemetry")  # per-step tables whose analyses are per rank: never loaded whole here


def rank_tables_runner(trace: Trace, workers: int | Workers = 1, client=None, progress: bool = False):
    """``(analyses, window) -> results`` for ``analyze(..., run_ranks=)``: the memory, telemetry and health
    analyses run over the ranks' files by the engine (``workers`` processes or pool here, or the Dask
    ``client``'s workers), so this process holds report rows, not the tables; what the reads skipped is added to
    ``trace.skipped`` as the loader would have, and the ranks' device totals become ``trace.telemetry`` (what
    memory_plan reads of it)."""
    from diag.analysis.memory import DeviceTotals
    from diag.analysis.report import telemetry_bounds_in_window

    def run_ranks(analyses, window: StepWindow) -> list:
        sources = rank_sources(trace, telemetry_bounds_in_window(trace.steps, window))
        plan = Plan((*analyses, DeviceTotals()), reported=("steps",))  # the load has said what it skipped of those
        stages = 2 if plan.second is not None else 1
        bar = _bar(len(sources) * stages, "per-rank analyses") if progress else None
        try:
            results, notes = run_two_stage(plan, sources, workers, client, bar and bar.update)
        finally:
            if bar is not None:
                bar.close()
        _account_rank_tables(trace, notes, results.pop())
        run_ranks.rows_read = notes.rows_read
        return results

    run_ranks.rows_read = 0
    return run_ranks


def _account_rank_tables(trace: Trace, notes: ReadNotes, device_totals: dict[int, int]) -> None:
    """What reading the ranks' memory and telemetry skipped and dropped, among the trace's notes, and the
    per-rank device totals as trace.telemetry (what memory_plan reads of it)."""
    add_read_notes(trace, notes)
    trace.telemetry = pd.DataFrame(
        {
            "rank": np.asarray(list(device_totals), dtype="int32"),
            "mem_total_bytes": pd.array(list(device_totals.values()), dtype="Int64"),
        }
    )


# -- the trace without its collectives ---------------------------------------------------------------------------


# The columns of the per-step tables that ``analyze`` reads from the loaded tables, as its analyses declare them
# (analysis/columns.py). The others (the step's forward/backward split, PCIe throughput, ...) are for the views
# and diag compare, which ask for the whole tables (``analyzed_columns_only=False``), or read rank by rank (the
# loss and gradient norms health reads).
ANALYSED_COLUMNS = loaded_columns()
INT32_SAFE_MAX = 2**30  # int64 columns below this are kept as int32: the sum of two (iteration = data wait + step) fits


class AnalysedColumnsReader(TraceReader):
    """The loader's per-rank read, each rank's per-step tables cut to the columns the analyses read as soon as
    they are read (before the ranks are concatenated), and whole microsecond counts that fit kept as int32: at
    16,384 ranks x 1,000 steps the steps table is ~16 M rows, and each int64 column dropped or halved is 65-130
    MB less on the client (docs/scale.md). A subclass keeps other columns by overriding ``kept_columns``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # (table, column) of the columns left out that held a value in a rank read so far: Trace.left_out_values
        self.left_out_values: set[tuple[str, str]] = set()

    def kept_columns(self) -> dict[str, tuple[str, ...]]:
        return ANALYSED_COLUMNS

    def read_rank(self, rank: int, rank_dir: Path) -> RankRead:
        read = super().read_rank(rank, rank_dir)
        for name, keep in self.kept_columns().items():
            if name in read.tables:
                arrow = read.tables[name]
                left_out = [c for c in arrow.column_names if c not in keep and c != "rank"]
                self.left_out_values |= {(name, c) for c in left_out if arrow.column(c).null_count < arrow.num_rows}
                read.tables[name] = arrow.select([c for c in ("rank", *keep) if c in arrow.column_names])
        return read

    def poll(self, progress=None) -> dict:
        return {**super().poll(progress), "left_out_values": frozenset(self.left_out_values)}

    def read_state(self) -> dict:
        return {**super().read_state(), "left_out_values": self.left_out_values}

    def merge_read_state(self, state: dict) -> None:
        super().merge_read_state(state)
        self.left_out_values |= state["left_out_values"]

    def frame(self, name: str, chunks: list) -> pd.DataFrame:
        keep = self.kept_columns().get(name)
        if keep is None or not chunks:  # no rows: the whole empty table, every column an analysis may look for
            return super().frame(name, chunks)
        table = TABLES[name]
        narrow = Table(table.name, table.doc, tuple(c for c in table.columns if c.name in keep))
        return narrow_int32(to_frame(chunks, narrow, rank_column=True), narrow)


def narrow_int32(frame: pd.DataFrame, table: Table) -> pd.DataFrame:
    """``table``'s int64 columns whose values all fit below INT32_SAFE_MAX as int32 (in place). Applied to the
    ranks' rows together (a worker's share narrowed alone, then concatenated with a share that was not, is
    int64 again and is checked here once more)."""
    for column in table.columns:
        if column.name not in frame:
            continue
        values = frame[column.name]
        if (
            column.dtype == "int64"
            and len(values)
            and values.min() >= -INT32_SAFE_MAX
            and values.max() < INT32_SAFE_MAX
        ):
            frame[column.name] = values.astype("int32")
    return frame


def load_without_collectives(
    path: str | Path,
    progress: bool = False,
    analysed_columns_only: bool = False,
    without: tuple[str, ...] = (),
    workers: Workers | None = None,
    client=None,
) -> Trace:
    """``diag.load`` of every table but the collectives (left empty: reduced by partition instead) and those in
    ``without`` (likewise: memory and telemetry, analysed rank by rank). ``analysed_columns_only``: the per-step
    tables with only the columns ``analyze`` reads (AnalysedColumnsReader), for a report; the views want them
    whole. ``workers``: a started pool whose workers read the ranks, or the Dask ``client`` whose workers do
    (``poll_in_workers``: analysed columns only, without RANK_TABLES; a pool of one: this process); the same
    Trace, frame for frame."""
    tables = tuple(name for name in TABLES if name != COLLECTIVES and name not in without)
    reader = (AnalysedColumnsReader if analysed_columns_only else TraceReader)(path, tables=tables)
    rank_dirs = _rank_dirs(reader)
    bar = _bar(len(rank_dirs), "loading ranks") if progress else None
    try:
        tick = bar.update if bar else None
        in_workers = client is not None or (workers is not None and workers.count > 1)
        data = poll_in_workers(workers, reader, tick, rank_dirs, client) if in_workers else reader.poll(progress=tick)
    finally:
        if bar is not None:
            bar.close()
    for name in (COLLECTIVES, *without):
        data[name] = empty_table(TABLES[name])
    trace = assemble_trace(Path(path), data)
    release_arrow_memory()
    return trace


def _rank_dirs(reader: TraceReader) -> dict[int, Path]:
    """The reader's rank directories; none is an error the user can act on."""
    rank_dirs = reader.rank_dirs()
    if not rank_dirs:
        raise TraceError(
            f"no diag traces in {reader.path}: expected rank00000/, rank00001/, ... sub-directories written by "
            "diag.init"
        )
    return rank_dirs


# What the load reads of each rank besides its side files when memory and telemetry are analysed rank by rank
_LOAD_TABLES = tuple(name for name in TABLES if name not in (COLLECTIVES, *RANK_TABLES))
STEPS = "steps"  # sent from a worker as its share's frame (narrowed, no categorical); the others as Arrow chunks
TICK_RANKS = 64  # a worker's progress said every this many ranks
# A worker converts its share's steps to pandas this many ranks at a time: converting a whole share at once holds
# its Arrow chunks and its frame together, ~2 GB a worker at 16,384 ranks x 1,000 steps in two shares
STEPS_PIECE_RANKS = 1024


def poll_in_workers(
    workers: Workers | None, reader: AnalysedColumnsReader, progress=None, rank_dirs=None, client=None
) -> dict:
    """``reader.poll()`` of a reader that has read nothing yet (of the per-step tables but the collectives,
    memory and telemetry, with the analysed columns: what ``analyze_partitioned`` loads), the ranks read by the
    started ``workers``, each a contiguous share (``read_share``), or by the workers of the Dask ``client``, a
    share per task; ``reader`` then reads on from where they stopped (a live view's next polls: diag.dashboard).
    ``rank_dirs``: the reader's, when listed already."""
    if type(reader) is not AnalysedColumnsReader or tuple(reader.tables) != _LOAD_TABLES:
        raise ValueError("poll_in_workers reads what analyze_partitioned loads: AnalysedColumnsReader(path, "
                         "tables=_LOAD_TABLES)")  # fmt: skip
    rank_dirs = _rank_dirs(reader) if rank_dirs is None else rank_dirs
    if client is not None:
        loaded = _read_shares_on_cluster(client, str(reader.path), list(rank_dirs.items()), progress)
    else:
        shares = [(str(reader.path), share) for share in contiguous_shares(list(rank_dirs.items()), workers.count)]
        loaded = workers.call(read_share, shares, progress, streamed=True)
    data = _gather_shares(reader, loaded, list(rank_dirs))
    del loaded
    return data


def read_share(share: tuple[str, list[tuple[int, Path]]], local: dict, channel) -> dict:
    """A worker's read (``poll_in_workers``) of what ``TraceReader.poll`` reads of a contiguous share of the ranks
    ``(path, [(rank, rank_dir)])``, in rank order: the steps streamed column by column (AnalysedColumnsReader's
    columns, int32 narrowing where a piece of STEPS_PIECE_RANKS ranks allows it); returned, the rest as
    ``gather_rank_reads`` gathers it but unconverted (manifests, heartbeats and events as records, the other
    tables' Arrow chunks), so that the caller builds the frames of every share's records at once, exactly as one
    load would. One thread reads (use_threads=False): Arrow's thread pools, idle in the process that forked the
    worker, are never used."""
    path, ranks = share
    reader = AnalysedColumnsReader(path, tables=_LOAD_TABLES)
    unconverted: list = []  # the steps' Arrow chunks of the ranks read since the last piece
    pieces: list[pd.DataFrame] = []

    def reads():
        for i, (rank, rank_dir) in enumerate(ranks):
            read = reader.read_rank(rank, Path(rank_dir))
            if STEPS in read.tables:
                unconverted.append(read.tables.pop(STEPS))
            if len(unconverted) == STEPS_PIECE_RANKS:
                pieces.append(reader.frame(STEPS, unconverted))  # empties the list: its Arrow freed as converted
            yield rank, read
            if (i + 1) % TICK_RANKS == 0 or i + 1 == len(ranks):
                channel.tick((i + 1) % TICK_RANKS or TICK_RANKS)

    chunks, rest = gather_rank_reads(reads(), tuple(t for t in _LOAD_TABLES if t != STEPS), [], frames=False)
    if unconverted:
        pieces.append(reader.frame(STEPS, unconverted))
    for name in list(pieces[0].columns) if pieces else []:  # one column at a time: its pickle is all in flight
        channel.column(name, pd.concat([piece.pop(name) for piece in pieces], ignore_index=True))
    pieces.clear()
    release_arrow_memory()
    release_heap_memory()  # the share's per-rank Arrow and frames: not kept into the passes
    rest["chunks"] = chunks
    rest["read_state"] = reader.read_state()  # where a live reader of the whole directory reads on from
    return rest


def _read_shares_on_cluster(client, path: str, ranks: list[tuple[int, Path]], progress=None) -> list[tuple]:
    """``read_share`` of contiguous shares of ``ranks`` on the Dask ``client``'s workers, a share per task of at
    most STEPS_PIECE_RANKS ranks (``engine.batch_size``); ``Workers.call``'s streamed results, in share order.
    ``progress(n)``: a share's ranks, once its task is done."""
    size = batch_size(len(ranks), len(client.scheduler_info()["workers"]), most=STEPS_PIECE_RANKS)
    shares = [ranks[i : i + size] for i in range(0, len(ranks), size)]
    futures = client.map(_read_share_task, [(path, share) for share in shares], pure=False)
    loaded = []
    for future, share in zip(futures, shares):
        loaded.append(future.result())
        future.release()  # its result is here now: the worker need not keep it
        if progress is not None:
            progress(len(share))
    return loaded


class _Collected:
    """``read_share``'s channel in a Dask task: the columns kept, to return with its result (a task's result moves
    whole); ticks dropped (the caller counts a task's ranks once it is done)."""

    def __init__(self):
        self.columns: dict[str, pd.Series] = {}

    def tick(self, n: int) -> None:
        pass

    def column(self, name: str, values: pd.Series) -> None:
        self.columns[name] = values


def _read_share_task(share: tuple[str, list[tuple[int, Path]]]) -> tuple[dict, dict]:
    """``read_share`` as a Dask task: (what it returned, the columns it streamed), as ``Workers.call`` gives it."""
    channel = _Collected()
    rest = read_share(share, {}, channel)
    return rest, channel.columns


def _gather_shares(reader: AnalysedColumnsReader, loaded: list[tuple[dict, dict]], ranks: list[int]) -> dict:
    """``TraceReader.poll``'s result from the workers' shares (in rank order): the directory's notes, then each
    share's; the frames built once from every share's records."""
    skipped = reader.dir_notes(once=True)  # as poll: said once, not again by a live reader's next poll
    manifests, heartbeats, events, nccl_logs = [], [], [], {}
    chunks: dict[str, list] = {name: [] for name in _LOAD_TABLES if name != STEPS}
    steps_shares = []
    for rest, steps_columns in loaded:
        reader.merge_read_state(rest.pop("read_state"))
        manifests += rest["manifests"]
        heartbeats += rest["heartbeats"]
        events += rest["events"]
        skipped += rest["skipped"]
        nccl_logs.update(rest["nccl_logs"])
        for name, arrows in rest["chunks"].items():
            chunks[name] += arrows
        if steps_columns:
            steps_shares.append(steps_columns)
    data = {name: reader.frame(name, chunks.pop(name)) for name in _LOAD_TABLES if name != STEPS}
    data[STEPS] = _steps_of_shares(reader, steps_shares)
    return {
        **data,
        "left_out_values": frozenset(reader.left_out_values),
        "manifests": manifests,
        "heartbeats": pd.DataFrame(heartbeats),
        "events": pd.DataFrame(events),
        "skipped": skipped,
        "nccl_logs": nccl_logs,
        "ranks": ranks,
    }


def _steps_of_shares(reader: AnalysedColumnsReader, shares: list[dict[str, pd.Series]]) -> pd.DataFrame:
    """The shares' steps frames (column by column, as the workers sent them) as one, in share order: a few
    contiguous columns concatenated, not thousands of per-rank Arrow chunks; int32 narrowing over all ranks."""
    if not shares:
        return reader.frame(STEPS, [])
    columns = {}
    for name in list(shares[0]):
        parts = [share.pop(name) for share in shares]
        columns[name] = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        del parts
    keep = reader.kept_columns()[STEPS]
    table = TABLES[STEPS]
    return narrow_int32(pd.DataFrame(columns, copy=False), Table(table.name, table.doc, tuple(
        c for c in table.columns if c.name in keep)))  # fmt: skip


def _bar(total: int, desc: str):
    from diag.progress import bar

    return bar(total, desc)


def collectives_reducer(trace: Trace, workers: int | Workers = 1, client=None, progress: bool = False):
    """``window -> ReducedWaits | None`` for ``analyze(..., reduce_collectives=)``: runs both passes on the engine
    (inline, in ``workers`` processes or pool, or on the Dask ``client``'s workers) and adds what they skipped or
    dropped to ``trace.skipped`` as the loader would have."""

    def reduce(window: StepWindow) -> ReducedWaits | None:
        tasks = rank_sources(trace)
        bar = _bar(2 * len(tasks), "collectives by rank") if progress else None
        try:
            sums, inst, notes = run_two_stage(Collectives(window), tasks, workers, client, bar and bar.update)
        finally:
            if bar is not None:
                bar.close()
        add_read_notes(trace, notes)
        reduce.rows_read = notes.rows_read
        del notes
        release_heap_memory()
        return reduced_waits(sums, inst)

    reduce.rows_read = 0  # collective rows read, before the checks and the window: 0 when there are none

    return reduce


def analyze_partitioned(
    path: str | Path,
    steps=None,
    peak_tflops: float | None = None,
    flops_per_step: float | None = None,
    client=None,
    progress: bool = False,
    with_trace: bool = False,
    analysed_columns_only: bool = True,
    workers: int | None = None,
):
    """``analyze(load(path))`` with the collectives reduced rank by rank: on this machine, or on the workers of
    the Dask ``client`` (which read ``path`` themselves: a filesystem they share). ``with_trace``: return
    (trace without its collectives, report, collective rows read); ``analysed_columns_only``: that trace's per-step
    tables hold only the columns the analyses read (False: whole, for views that draw the others); ``workers``:
    worker processes of the per-rank work (None: ``diag.processes.worker_count`` decides; 1: all here)."""
    from diag.analysis.report import analyze

    # memory and telemetry are analysed rank by rank too, unless the caller wants the trace's tables whole
    per_rank = RANK_TABLES if analysed_columns_only else ()
    count = 1 if client is not None else worker_count(len(TraceReader(path).rank_dirs()), workers)
    with Workers(count) as pool:  # forked once, before the load: the load, then every pass
        # the workers, or the cluster's, read the per-step tables too, each a share of the ranks
        loads_in, cluster = (pool, client) if analysed_columns_only else (None, None)
        trace = load_without_collectives(path, progress, analysed_columns_only, per_rank, loads_in, cluster)
        tables = rank_tables_runner(trace, pool, client, progress) if per_rank else None
        reducer = collectives_reducer(trace, pool, client, progress)
        report = analyze(trace, steps=steps, peak_tflops=peak_tflops, flops_per_step=flops_per_step,
                         reduce_collectives=reducer, run_ranks=tables)  # fmt: skip
    rows_read = reducer.rows_read + (tables.rows_read if tables is not None else 0)
    return (trace, report, rows_read) if with_trace else report
