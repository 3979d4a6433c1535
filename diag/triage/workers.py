"""The ranks of a large trace read by ``diag triage`` in worker processes (how many: ``diag.processes.worker_count``).

Reading a rank for triage (its side files, the last row groups of its steps and collectives) is ~2.5 ms of
CPU, mostly Python and pyarrow calls on small files: threads run it one at a time under the GIL, so 16,384
ranks of an old trace (heartbeats without ``groups``: every rank's tables read) took ~60 s of CPU on one core.
Here each worker, forked after the imports (it starts in milliseconds and imports nothing again), reads a
contiguous share of the ranks, as ``diag.analysis.partitioned.ProcessEngine`` shares its passes, and sends back
compact records: per rank its side read (manifest and heartbeat JSON objects, dumps, what was skipped), and for
its whole share one Arrow table per table holding only the tail rows triage reads (not per-rank frames).

Two rounds, because which ranks a heartbeat decides is a judgement over every rank's heartbeat
(``summary.judged_by_heartbeat``): first every rank's side files, and the tables of the ranks no heartbeat can
decide (none, or one without ``groups``: an old trace's ranks are all read in this round); then the tables of
the ranks whose heartbeat could have decided them and did not. The rows come back in rank order, as the
in-process read gathers them, so the verdict is the same.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from diag.processes import contiguous_shares, next_result, start_worker

TICK_RANKS = 64  # a worker says its progress every this many ranks
COMBINE_RANKS = 256  # a worker copies its ranks' tails into one table this often: the decoded row groups are freed


def read_in_workers(
    path: Path, rank_dirs: dict[int, Path], rows: int, workers: int, use_heartbeats: bool, judge, tick=None
):
    """``sources._read_tails``'s reads, by ``workers`` forked processes: (sides, tables, per_rank) where sides is
    ``{rank: (side read, dump info, heartbeat)}``, tables ``{table name: [one Arrow table per share, in rank
    order]}`` and per_rank ``{rank: (skipped, cut)}`` for the ranks whose tables were read. ``judge(sides)``: the
    ranks judged from their heartbeats (``use_heartbeats`` False: none, and every rank's tables are read in the
    first round). ``tick(n)``: n more ranks read (the first round)."""
    shares = contiguous_shares(list(rank_dirs.items()), workers)
    pipes, procs, done = [], [], False
    try:
        for share in shares:
            pipe, proc = start_worker(_worker_main, str(path), share, rows, use_heartbeats)
            pipes.append(pipe)
            procs.append(proc)
        sides, early = {}, set()
        for pipe in pipes:
            share_sides, share_early = _answer(pipe, tick)
            sides.update(share_sides)
            early |= share_early
        judged = judge(sides)
        for pipe, share in zip(pipes, shares):
            pipe.send([rank for rank, _ in share if rank not in judged and rank not in early])
        tables: dict[str, list[pa.Table]] = {}
        per_rank: dict = {}
        for pipe in pipes:
            share_tables, share_per_rank = _answer(pipe, None)
            for name, arrow in share_tables.items():
                tables.setdefault(name, []).append(arrow)
            per_rank.update(share_per_rank)
        done = True
    finally:
        for proc in procs:
            if not done:  # a worker failed or this process was interrupted: the others would wait for a reply
                proc.kill()
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return sides, tables, per_rank


def _answer(pipe, tick):
    """A worker's next result, its progress ticks counted on the way; its error raised here."""
    return next_result(pipe, tick, "diag triage")[1]


def _worker_main(pipe, path: str, share: list[tuple[int, Path]], rows: int, use_heartbeats: bool) -> None:
    """One worker: the side files of its share (and the tables of the ranks no heartbeat can decide), then the
    tables of the ranks this process names; the tables sent once, as one Arrow table each."""
    from diag.trace.loader import TraceReader
    from diag.triage.sources import TRIAGE_TABLES, _read_rank_side, _read_rank_tables

    try:
        reader = TraceReader(path, tables=())
        names, sides, per_rank = {}, {}, {}
        tables = _Gathered(TRIAGE_TABLES)
        for i, (rank, rank_dir) in enumerate(share):
            read, names[rank], info, beat = _read_rank_side(reader, rank, rank_dir)
            sides[rank] = (read, info, beat)
            if not use_heartbeats or beat is None or beat.groups is None:  # never judged from its heartbeat
                per_rank[rank] = tables.add(*_read_rank_tables(reader, rank, rank_dir, names[rank], rows, copy=False))
            if (i + 1) % TICK_RANKS == 0:
                pipe.send(("tick", TICK_RANKS))
        pipe.send(("tick", len(share) % TICK_RANKS))
        pipe.send(("sides", (sides, set(per_rank))))
        del sides
        dirs = dict(share)
        later = pipe.recv()  # ranks whose heartbeat could have decided them and did not: fewer, read after
        for rank in later:
            per_rank[rank] = tables.add(*_read_rank_tables(reader, rank, dirs[rank], names[rank], rows, copy=False))
        pipe.send(("tables", (tables.result(in_rank_order=not later), per_rank)))
    except Exception:  # noqa: BLE001 - said to the reading process, which raises it
        pipe.send(("error", traceback.format_exc()))


class _Gathered:
    """A worker's tails, one Arrow table per table in the end. A tail is a slice of its rank's decoded row
    groups: every COMBINE_RANKS ranks the slices are copied into one contiguous table (kept as slices, every
    rank's decoded groups would stay alive: ~0.5 MB a rank)."""

    def __init__(self, table_names: tuple[str, ...]):
        self.combined: dict[str, list[pa.Table]] = {name: [] for name in table_names}
        self.pending: dict[str, list[pa.Table]] = {name: [] for name in table_names}
        self.ranks = 0

    def add(self, tables: dict[str, pa.Table], cut: bool, skipped: list) -> tuple[list, bool]:
        """One rank's tail (``_read_rank_tables``'s result); returns what the reading process keeps of it."""
        for name, arrow in tables.items():
            self.pending[name].append(arrow)
        self.ranks += 1
        if self.ranks % COMBINE_RANKS == 0:
            self._combine()
        return skipped, cut

    def _combine(self) -> None:
        for name, pending in self.pending.items():
            if pending:
                self.combined[name].append(_contiguous(pending))
                pending.clear()

    def result(self, in_rank_order: bool) -> dict[str, pa.Table]:
        """One table each; ``in_rank_order`` False: ranks were added out of order, the rows are sorted by rank
        (a stable sort: each rank's rows keep their order)."""
        self._combine()
        out = {}
        for name, parts in self.combined.items():
            if parts:
                arrow = _contiguous(parts)
                if not in_rank_order:
                    arrow = arrow.take(pc.sort_indices(arrow, [("rank", "ascending")]))
                out[name] = arrow
        return out


def _contiguous(parts: list[pa.Table]) -> pa.Table:
    """One table, one chunk a column (dictionaries unified): pickled as a few buffers, not thousands."""
    arrow = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    return arrow.unify_dictionaries().combine_chunks()
