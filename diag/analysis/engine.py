"""The analysis engine: an analysis that works rank by rank is written once, as ``map`` (some ranks' cleaned
tables -> a partial), an associative ``combine`` and ``finish`` (-> its result), and one runner executes it
over the ranks of a trace: inline, in worker processes (``--workers N``: a ``diag.processes.Workers`` pool, which
a caller may start once for all its runs) or on a Dask cluster. An analysis whose second stage needs what every
rank's first found (``StagedAnalysis``: health, which judges each rank against all the others) adds ``between``,
``second`` and ``combine2``. A ``Plan`` runs a run's analyses from one read of each rank, and is itself a
``TwoStageAnalysis`` (as the collectives are), which ``run_two_stage`` runs on the same three executors, each
rank's stage-1 state kept where it was computed.

Because ``combine`` is associative and the partials do not depend on which ranks were read together, any
batching and any order of the ranks give the same result: the in-memory report maps its loaded tables as one
shard, a trace of 16,384 ranks is mapped a batch of ranks at a time, and both finish through the same code.
Every function here is top-level and pickles its arguments: a worker process or a Dask worker runs it as this
process does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd

from diag.processes import Workers, contiguous_shares
from diag.trace.columnar import required_columns
from diag.trace.loader import CLEANING_COLUMNS, ReadNotes, Skipped, TraceReader, clean_rank_tables, to_frame
from diag.trace.schema import EVENTS_FILE, HEARTBEAT_FILE, MANIFEST_FILE, NCCL_LOG_FILE, TABLES

P = TypeVar("P")
R = TypeVar("R", covariant=True)

BATCH_RANKS = 64  # ranks mapped together: pandas' per-call cost (~20 ms a rank alone) shared
TASKS_PER_DASK_WORKER = 4  # a cluster's tasks per worker: balance between workers of unequal speed
HELD_BYTES_MAX = 3584 << 20  # stage-1 states kept in one process between the stages; beyond, a rank is read again
COMBINE_FANIN = 16  # partials combined this many at a time on a cluster (a tree)
SIDE_FILES = {MANIFEST_FILE, HEARTBEAT_FILE, EVENTS_FILE, NCCL_LOG_FILE}  # the load already said what it skipped


@dataclass
class Shard:
    """Some ranks' tables as ``diag.load`` cleans them (each with its rank column), and each rank's telemetry
    window: from the start of its first step in the step window to the end of its last, on its own clock
    (``first_us``, ``last_us`` by rank; a rank without steps in the window has none)."""

    tables: dict[str, pd.DataFrame]
    window_us: pd.DataFrame
    _telemetry_w: pd.DataFrame | None = field(default=None, repr=False)

    def table(self, name: str) -> pd.DataFrame:
        """The shard's table ``name`` (empty, with the schema's columns, where none of its ranks has rows)."""
        from diag.trace.loader import empty_table

        return self.tables[name] if name in self.tables else empty_table(TABLES[name])

    def telemetry_in_window(self) -> pd.DataFrame:
        """Telemetry samples taken while their rank ran the steps of the window (computed once per shard: the
        memory and telemetry analyses both read them)."""
        if self._telemetry_w is None:
            tel = self.table("telemetry")
            first = self.window_us["first_us"].reindex(tel["rank"]).to_numpy(dtype="float64")
            last = self.window_us["last_us"].reindex(tel["rank"]).to_numpy(dtype="float64")
            time_us = tel["time_us"].to_numpy(dtype="float64", na_value=np.nan)
            self._telemetry_w = tel[(time_us >= first) & (time_us <= last)]  # NaN bounds (no step): no sample
        return self._telemetry_w


class Analysis(Protocol[P, R]):
    """What an analysis that works rank by rank implements. ``reads``: the tables and columns ``map`` reads.
    ``combine`` must be associative and must not depend on the order of its arguments' ranks."""

    reads: Mapping[str, tuple[str, ...]]

    def map(self, shard: Shard) -> P: ...

    def combine(self, a: P, b: P) -> P: ...

    def finish(self, partial: P) -> R: ...


@dataclass(frozen=True)
class RankSource:
    """What a worker needs to read one rank: its directory (a filesystem every worker sees) and what the load
    decided for it."""

    trace_dir: str
    rank: int
    rank_dir: str
    cut_us: float | None  # rows stamped before this belong to an earlier run appended to the same files
    offset_us: float = 0.0  # the rank's clock minus rank 0's
    first_us: float = float("nan")  # the rank's telemetry window (see Shard); NaN: no step in the window
    last_us: float = float("nan")


class StagedAnalysis(Protocol):
    """An analysis over shards whose second stage needs what the first found on every rank (health: a rank's
    departure from its peers needs every rank's values at each step). ``map``: a shard -> (what each of its
    ranks keeps for stage 2, by rank, each with ``nbytes``; a partial); ``combine`` (associative, any order) ->
    ``between`` -> (what ``finish`` needs, the ``broadcast`` each rank's ``second`` reads); ``combine2`` of any
    number of the second stage's partials (none: the identity) -> ``finish``."""

    reads: Mapping[str, tuple[str, ...]]

    def map(self, shard: Shard) -> tuple[dict[int, Any], Any]: ...

    def combine(self, a, b): ...

    def between(self, partial) -> tuple[Any, Any]: ...

    def second(self, kept, broadcast): ...

    def combine2(self, *partials): ...

    def finish(self, state, partial2): ...


def is_staged(analysis) -> bool:
    return hasattr(analysis, "second")


class RankKept(tuple):
    """One rank's stage-1 states, one per staged analysis of a Plan (None: the rank had no rows for it)."""

    @property
    def nbytes(self) -> int:
        return sum(state.nbytes for state in self if state is not None)


@dataclass(frozen=True)
class Plan:
    """The analyses of one run over batches of ranks, each batch read once as one Shard: the TwoStageAnalysis
    ``run_two_stage`` runs. Stage 1 maps every analysis; stage 2 runs the second stage of the staged ones; the
    result is (the analyses' results, in order; what the reads skipped). ``reported``: tables the caller loaded
    already, whose skipped files and dropped rows its load has listed."""

    analyses: tuple[Analysis | StagedAnalysis, ...]
    reported: tuple[str, ...] = ()

    @property
    def staged(self) -> tuple[StagedAnalysis, ...]:
        return tuple(a for a in self.analyses if is_staged(a))

    @property
    def second(self):
        """``run_two_stage`` ends after stage 1 where this is None: no analysis has a second stage."""
        return self._second if self.staged else None

    def columns(self) -> dict[str, tuple[str, ...]]:
        """Per table read, the columns the analyses read, its keys, what cleaning a rank's rows reads and what
        every segment holds, in the table's own order."""
        from diag.analysis.columns import KEYS

        out = {}
        for name in TABLES:
            reads = {c for a in self.analyses for c in a.reads.get(name, ())}
            if reads:
                wanted = reads | {*KEYS.get(name, ()), *CLEANING_COLUMNS, *required_columns(TABLES[name])}
                out[name] = tuple(c for c in TABLES[name].column_names if c in wanted)
        return out

    def first(self, sources: list[RankSource]) -> tuple[list[RankKept], tuple[list, ReadNotes]]:
        shard, notes = read_shard(sources, self.columns(), self.reported)
        kept, partials = self.map(shard)
        if not self.staged:  # nothing kept between the stages
            return [], (partials, notes)
        empty = RankKept((None,) * len(self.staged))
        return [kept.get(s.rank, empty) for s in sources], (partials, notes)

    def map(self, shard: Shard) -> tuple[dict[int, RankKept], list]:
        """The shard's partial of each analysis, and each of its ranks' stage-1 states."""
        partials, kept_by = [], []
        for a in self.analyses:
            if is_staged(a):
                kept, partial = a.map(shard)
                kept_by.append(kept)
            else:
                partial = a.map(shard)
            partials.append(partial)
        ranks = sorted({r for kept in kept_by for r in kept})
        return {r: RankKept(kept.get(r) for kept in kept_by) for r in ranks}, partials

    def combine(self, *partials: tuple[list, ReadNotes]) -> tuple[list, ReadNotes]:
        out = partials[0] if partials else (self.map(Shard({}, no_windows()))[1], ReadNotes())
        for partial, notes in partials[1:]:
            out = ([a.combine(x, y) for a, x, y in zip(self.analyses, out[0], partial)], out[1] + notes)
        return out

    def between(self, partial: tuple[list, ReadNotes]) -> tuple[tuple[list, ReadNotes], list]:
        partials, notes = partial
        states, broadcasts = [], []
        for a, p in zip(self.analyses, partials):
            state, broadcast = a.between(p) if is_staged(a) else (p, None)
            states.append(state)
            if is_staged(a):
                broadcasts.append(broadcast)
        return (states, notes), broadcasts

    def _second(self, kept: RankKept, broadcasts: list) -> list:
        return [a.combine2() if s is None else a.second(s, b) for a, s, b in zip(self.staged, kept, broadcasts)]

    def combine2(self, *partials: list) -> list:
        return [a.combine2(*(p[i] for p in partials)) for i, a in enumerate(self.staged)]

    def finish(self, state: tuple[list, ReadNotes], partial2: list | None) -> tuple[list, ReadNotes]:
        states, notes = state
        seconds = iter(partial2 if partial2 is not None else self.combine2())
        results = [a.finish(s, next(seconds)) if is_staged(a) else a.finish(s) for a, s in zip(self.analyses, states)]
        return results, notes


def run_loaded(analyses: Sequence[Analysis | StagedAnalysis], shard: Shard) -> list:
    """The analyses' results over tables already loaded (every rank in one shard); the second stage of the staged
    ones over its ranks in rank order, as the runner folds them."""
    plan = Plan(tuple(analyses))
    kept, partials = plan.map(shard)
    state, broadcasts = plan.between((partials, ReadNotes()))
    partial2 = plan.combine2(*(plan.second(kept[r], broadcasts) for r in sorted(kept))) if plan.staged else None
    return plan.finish(state, partial2)[0]


def run(
    analyses: Sequence[Analysis | StagedAnalysis],
    sources: Sequence[RankSource],
    workers: int | Workers = 1,
    client=None,
    progress: Callable[[int], None] | None = None,
    reported: tuple[str, ...] = (),
) -> tuple[list, ReadNotes]:
    """The analyses' results over the ranks of ``sources``, each rank read once by the loader's per-rank read,
    and what the reads skipped (but of the ``reported`` tables): ``run_two_stage`` of their Plan (inline, in
    ``workers`` processes or the Dask ``client``'s workers)."""
    return run_two_stage(Plan(tuple(analyses), reported), sources, workers, client, progress)


def read_shard(
    sources: Sequence[RankSource], columns: Mapping[str, tuple[str, ...]], reported: tuple[str, ...] = ()
) -> tuple[Shard, ReadNotes]:
    """The ranks' tables (``columns``: the columns read of each) as ``diag.load`` gives their rows (the loader's
    per-rank read, an earlier run's rows cut as the load cuts them), and what was skipped, but of the
    ``reported`` tables. A rank that cannot be read is named and left out."""
    names = tuple(columns)
    reader = TraceReader(sources[0].trace_dir, tables=names, segment_columns=dict(columns)) if sources else None
    chunks: dict[str, list] = {name: [] for name in names}
    notes = ReadNotes()
    for source in sources:
        try:
            read = reader.read_rank(source.rank, Path(source.rank_dir))
        except Exception as exc:  # noqa: BLE001 - a damaged rank is skipped and named, the others analysed
            note = Skipped(source.rank_dir, f"{' and '.join(names)} unreadable, rank left out of them: {exc!r}")
            notes.skipped.append((source.rank, note))
            continue
        notes.skipped += [(source.rank, s) for s in read.skipped if not _reported(Path(s.path).name, reported)]
        fresh = {name: arrow for name, arrow in read.tables.items() if name not in reported}
        notes.rows_read += sum(arrow.num_rows for arrow in fresh.values())
        cleaned, dropped = clean_rank_tables(fresh, source.cut_us)
        cleaned.update(clean_rank_tables({n: read.tables[n] for n in reported if n in read.tables}, source.cut_us)[0])
        notes.dropped += dropped
        for name, arrow in cleaned.items():
            chunks[name].append(arrow)
    tables = {name: to_frame(chunks.pop(name), TABLES[name], rank_column=True) for name in names}
    window_us = pd.DataFrame(
        {"first_us": [s.first_us for s in sources], "last_us": [s.last_us for s in sources]},
        index=pd.Index([s.rank for s in sources], name="rank"),
    )
    return Shard(tables, window_us), notes


def _reported(file_name: str, reported: tuple[str, ...]) -> bool:
    """A side file (the load listed what it skipped of those) or a file of a ``reported`` table (``steps.csv``,
    ``steps.000001.parquet``)."""
    return file_name in SIDE_FILES or file_name.split(".")[0] in reported


class TwoStageAnalysis(Protocol):
    """An analysis whose second stage needs what the first found on every rank. ``first``: some ranks read into
    what stage 2 needs of each (``kept``, one per source, in order; its ``nbytes`` say its size) and a partial;
    ``combine`` of the partials -> ``between`` -> (what ``finish`` needs, the ``broadcast`` every rank's
    ``second`` reads); ``combine2`` of the second stage's partials -> ``finish``. Both combines take any number
    of partials (none: the identity), are associative and keep their arguments' order (a left fold here, trees
    on a cluster). An analysis whose ``second`` is None ends after stage 1: ``finish(state, None)``."""

    def first(self, sources: list[RankSource]) -> tuple[list, Any]: ...

    def combine(self, *partials): ...

    def between(self, partial) -> tuple[Any, Any]: ...

    def second(self, kept, broadcast): ...

    def combine2(self, *partials): ...

    def finish(self, state, partial2): ...


def run_two_stage(
    analysis: TwoStageAnalysis,
    sources: Sequence[RankSource],
    workers: int | Workers = 1,
    client=None,
    progress: Callable[[int], None] | None = None,
):
    """The two-stage analysis' result over the ranks of ``sources``. Inline with ``workers`` 1 (stage-1 states
    held here up to HELD_BYTES_MAX, ranks beyond read again); in that many worker processes (forked for this
    run), or in a started ``Workers`` pool, each worker a contiguous share of the ranks that it keeps between the
    stages; on the Dask ``client``'s workers, the states staying there as futures. ``progress(n)``: n more ranks
    done, each rank counted once per stage."""
    sources = list(sources)
    if client is not None:
        return _two_stage_dask(analysis, sources, client, progress)
    if not isinstance(workers, Workers):  # a pool for this run alone (of one: nothing forked)
        with Workers(min(workers, len(sources))) as pool:
            return run_two_stage(analysis, sources, pool, progress=progress)
    if workers.count > 1 and len(sources) > 1:
        return _two_stage_processes(analysis, sources, workers, progress)
    stages = HeldStages(analysis, sources, progress)
    state, broadcast = analysis.between(stages.first())
    return analysis.finish(state, None if analysis.second is None else stages.second(broadcast))


class HeldStages:
    """Both stages over ``sources`` in this process, BATCH_RANKS ranks at a time; the stage-1 states held between
    them up to HELD_BYTES_MAX bytes, a rank beyond read again in stage 2. Stage 2's partials fold left in rank
    order, so its float sums are those of one rank after another."""

    def __init__(self, analysis: TwoStageAnalysis, sources: list[RankSource], progress=None):
        self.analysis, self.sources, self.kept = analysis, sources, {}
        self._tick = lambda n: progress(n) if progress is not None and n else None

    def first(self):
        a, held, partial = self.analysis, 0, self.analysis.combine()
        for i in range(0, len(self.sources), BATCH_RANKS):
            batch = self.sources[i : i + BATCH_RANKS]
            kept, batch_partial = a.first(batch)
            partial = a.combine(partial, batch_partial)
            for source, state in zip(batch, kept):
                if held + state.nbytes <= HELD_BYTES_MAX:
                    self.kept[source.rank] = state
                    held += state.nbytes
            del kept
            self._tick(len(batch))
        release_arrow_memory()
        return partial

    def second(self, broadcast):
        a, out, batch = self.analysis, self.analysis.combine2(), []
        for source in self.sources:
            kept = self.kept.pop(source.rank, None)
            batch.append(a.second(a.first([source])[0][0] if kept is None else kept, broadcast))
            if len(batch) >= BATCH_RANKS:
                out, batch = a.combine2(out, *batch), []
                self._tick(BATCH_RANKS)
        self._tick(len(batch))
        release_arrow_memory()
        return a.combine2(out, *batch)


def _two_stage_processes(analysis: TwoStageAnalysis, sources: list[RankSource], workers: Workers, progress):
    """Both stages in the ``workers`` pool, each worker running HeldStages on its contiguous share and keeping it
    between the two calls; this process combines their partials in share order. Only the partials, the broadcast
    and the ticks move through the pipes."""
    shares = contiguous_shares(sources, workers.count)
    partial = analysis.combine(*workers.call(_first_stage, [(analysis, share) for share in shares], progress))
    state, broadcast = analysis.between(partial)
    del partial
    partial2 = None
    if analysis.second is not None:
        partial2 = analysis.combine2(*workers.call(_second_stage, [broadcast] * len(shares), progress))
    return analysis.finish(state, partial2)


def _first_stage(share: tuple[TwoStageAnalysis, list[RankSource]], local: dict, channel):
    """A worker's stage 1 of its share (``Workers.call``); its HeldStages kept in ``local`` for stage 2."""
    analysis, sources = share
    stages = HeldStages(analysis, sources, channel.tick)
    if analysis.second is not None:
        local["stages"] = stages
    return stages.first()


def _second_stage(broadcast, local: dict, channel):
    """A worker's stage 2 of the share its stage 1 kept."""
    return local.pop("stages").second(broadcast)


def _two_stage_dask(analysis: TwoStageAnalysis, sources: list[RankSource], client, progress):
    """Both stages on a Dask cluster, a batch of ranks per task: the stage-1 states stay on the workers as
    futures; the partials and the second stage's combine in trees; the broadcast is scattered to every worker."""
    size = batch_size(len(sources), len(client.scheduler_info()["workers"]))
    batches = [sources[i : i + size] for i in range(0, len(sources), size)]
    firsts = client.map(_first_batch, batches, analysis=analysis, pure=False)
    kept = [client.submit(operator.getitem, f, 0, pure=False) for f in firsts]
    partials = [client.submit(operator.getitem, f, 1, pure=False) for f in firsts]
    del firsts
    # no reference kept to a tree's leaves or to the states once their consumers are submitted: the scheduler
    # frees each on the workers as soon as the task reading it is done
    state, broadcast = analysis.between(_tree(client, analysis.combine, partials))
    del partials
    partial2 = None
    if analysis.second is not None:
        sent = client.scatter(broadcast, broadcast=True)
        seconds = client.map(_second_batch, kept, analysis=analysis, broadcast=sent, pure=False)
        del kept
        partial2 = _tree(client, analysis.combine2, seconds)
    if progress is not None:
        progress(len(sources) * (1 if analysis.second is None else 2))
    return analysis.finish(state, partial2)


def _first_batch(sources: list[RankSource], analysis: TwoStageAnalysis):
    return analysis.first(sources)


def _second_batch(kept: list, analysis: TwoStageAnalysis, broadcast):
    return analysis.combine2(*(analysis.second(state, broadcast) for state in kept))


def _tree(client, combine, futures: list):
    """The futures' results combined COMBINE_FANIN at a time, level by level, on the cluster; the result. Empties
    ``futures``: each level's inputs are freed once combined."""
    level = futures[:]
    futures.clear()
    if not level:
        return combine()
    while len(level) > 1:
        level = [
            client.submit(combine, *level[i : i + COMBINE_FANIN], pure=False)
            for i in range(0, len(level), COMBINE_FANIN)
        ]
    return level[0].result()


def release_arrow_memory() -> None:
    """Give back to the OS what Arrow's allocator keeps of freed parse buffers (mimalloc/jemalloc hold them):
    1,024 ranks' per-step tables leave ~0.23 GB that nothing else would reuse (numpy allocates elsewhere)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def window_us_of(bounds: pd.DataFrame | None) -> pd.DataFrame:
    """A Shard's ``window_us`` from ``report.telemetry_bounds`` (None: no step in the window)."""
    return no_windows() if bounds is None else bounds[["first_us", "last_us"]]


def rank_sources(trace, bounds: pd.DataFrame | None = None) -> list[RankSource]:
    """One source per rank of the run (ranks of other runs were left out by the load); ``bounds``: the ranks'
    telemetry windows (``report.telemetry_bounds``)."""
    rank_dirs = TraceReader(trace.path).rank_dirs()
    cuts = trace.earlier_run_cuts_us
    offsets = trace.clock_offsets_us()
    first = bounds["first_us"].to_dict() if bounds is not None else {}
    last = bounds["last_us"].to_dict() if bounds is not None else {}
    return [
        RankSource(
            str(trace.path),
            rank,
            str(rank_dirs.get(rank, trace.path / f"rank{rank:05d}")),  # gone since the load: its read says so
            cuts.get(rank),
            float(offsets.get(rank, 0.0)),
            float(first.get(rank, np.nan)),
            float(last.get(rank, np.nan)),
        )
        for rank in trace.ranks_found
    ]


def batch_size(ranks: int, workers: int, most: int = BATCH_RANKS) -> int:
    """Ranks per task on a cluster: at least TASKS_PER_DASK_WORKER tasks per worker (balance), at most ``most``
    (memory per task)."""
    return max(1, min(most, -(-ranks // (TASKS_PER_DASK_WORKER * max(workers, 1)))))


def no_windows() -> pd.DataFrame:
    return pd.DataFrame({"first_us": [], "last_us": []}, index=pd.Index([], name="rank", dtype="int64"))
