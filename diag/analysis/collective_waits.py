"""Each collective row's wait for the last rank of its group to arrive, reduced to what the analyses read
(``ReducedWaits``, diag.analysis.comms), in bounded memory: the collectives' two-stage analysis.

The collectives are ~95% of a trace's records (20 per rank-step) and, loaded whole, ~5 GB per thousand ranks
(docs/scale.md). Here each rank's collectives are read on their own (the loader's per-rank read, so whatever the
file format) and reduced in two stages, run by the engine (``engine.run_two_stage``: inline, in worker processes
or on Dask):

1. ``read_part``: the rank's rows after the loader's whole-trace checks (insane durations, an earlier run
   appended to the same files, the step window), kept compact (``RankPart``, ~5 bytes a row), and a partial
   of each collective instance (pg, seq): its shortest duration, largest size, latest issue, rows. Partials
   combine associatively (``combine_partials``) into the instance table: one row per collective instance,
   whatever the number of ranks in it.
2. ``finish_part``: with the instance table, each row's wait for the last rank, reduced to what the analyses
   read (``CollectiveSums``: wait per step, arrivals, per op/group/size sums and exact value counts), which
   again merge associatively (``merge_sums``).

A loaded trace's collectives go through the same two stages (``loaded_waits``), each rank's part built from its
rows of the loaded table. Every function here is top-level and pickles its arguments: a Dask worker runs it as
the local path does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from diag.analysis.comms import OpGroup, ReducedWaits, ValueCounts, canonical_op, size_bucket
from diag.analysis.engine import SIDE_FILES, RankSource, run_two_stage
from diag.analysis.window import StepWindow, in_window, in_window_array
from diag.trace.loader import Dropped, ReadNotes, Skipped, TraceReader, clean_rank_tables

COLLECTIVES = "collectives"


@dataclass(frozen=True)
class Runs:
    """Integers as runs of equal values: a rank's steps (some 20 collectives each) and its seqs' distances from
    its previous seq of the same group (1, but at a group's first row) in a few bytes where a plain array takes
    2 to 8 a row. Values offset by ``lo`` and lengths in the narrowest dtypes: with no runs at all (each value
    differs from the one before), 4 bytes a row where the values' range fits 16 bits."""

    lo: int
    values: np.ndarray  # minus lo
    lengths: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> Runs:
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]])) if len(values) else _NO_INTS
        lo, offset = _offset_int(values[starts])
        return cls(lo, offset, _narrow_count(np.diff(starts, append=len(values))))

    def decode(self) -> np.ndarray:
        return np.repeat(self.values.astype("int64") + self.lo, self.lengths)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.lengths.nbytes


_NO_INTS = np.zeros(0, dtype="int64")


def _narrow_count(counts: np.ndarray) -> np.ndarray:
    top = int(counts.max()) if len(counts) else 0
    return counts.astype("uint16" if top < 2**16 else "uint32" if top < 2**32 else "int64")


def _seq_runs(seq: np.ndarray, pg: np.ndarray, groups: int) -> Runs:
    """``seq`` as ``Runs`` of each row's distance from the previous seq of its group (from 0 at its first)."""
    distance = np.empty(len(seq), dtype="int64")
    for rows in _group_rows(pg, groups):
        distance[rows] = np.diff(seq[rows], prepend=0)
    return Runs.of(distance)


def _group_rows(pg: np.ndarray, groups: int) -> list:
    """Each group's rows, in code order: a slice of all where there is one group, so neither an index array nor
    a copy."""
    return [slice(None)] if groups == 1 else [np.flatnonzero(pg == code) for code in range(groups)]


@dataclass
class RankPart:
    """One rank's collectives in the window, compact. Matched rows (same (pg, seq) on every rank of the group)
    as arrays and runs (~5 B a row); rows matched with no other rank (point-to-point, unknown seq) as a small
    frame."""

    rank: int
    pg_names: list[str]
    pg: np.ndarray  # int8 codes into pg_names (int16, int32 with more groups)
    seq: Runs  # each row's distance from the previous seq of its group: ``seqs()``
    duration_us: np.ndarray  # float32 where exact, else float64; NaN: untimed
    step: Runs
    blocking: np.ndarray  # packed bits: ``blockings()``
    start_us: np.ndarray  # float64 on rank 0's clock, for the untimed rows only (in their order)
    unmatched: pd.DataFrame  # pg, op, bytes, duration_us, step, blocking
    skipped: list[Skipped] = field(default_factory=list)
    dropped: Dropped = field(default_factory=Dropped)  # by the loader's cleaning
    rows_read: int = 0  # valid rows in the files, before the cleaning and the window

    def seqs(self) -> np.ndarray:
        distance, out = self.seq.decode(), np.empty(len(self.pg), dtype="int64")
        for rows in _group_rows(self.pg, len(self.pg_names)):
            out[rows] = np.cumsum(distance[rows])
        return out

    def steps(self) -> np.ndarray:
        return self.step.decode()

    def blockings(self) -> np.ndarray:
        return np.unpackbits(self.blocking, count=len(self.pg)).astype(bool)

    @property
    def nbytes(self) -> int:
        arrays = (self.pg, self.seq, self.duration_us, self.step, self.blocking, self.start_us)
        loose = int(self.unmatched.memory_usage(deep=True).sum()) if len(self.unmatched) else 0  # ~1 ms: often none
        return sum(a.nbytes for a in arrays) + loose

    @property
    def rows(self) -> int:
        return len(self.pg) + len(self.unmatched)

    def __sizeof__(self) -> int:
        # what Dask's sizeof (sys.getsizeof for unknown types) reports: without it a part looked like 56 bytes,
        # so the scheduler moved batches of parts between workers as if free (docs/scale.md, "Limits")
        return object.__sizeof__(self) + self.nbytes


# -- pass 1 ----------------------------------------------------------------------------------------------------


# The columns read of a rank's Parquet segments here: what the reductions use. The others are nullable and read
# as nulls (TableSegments.columns): a collective's dtype, peer and source are never analysed.
COLLECTIVE_COLUMNS = ("step", "pg", "seq", "op", "bytes", "start_us", "duration_us", "blocking")


def read_rank_collectives(task: RankSource):
    """The rank's collectives as Arrow (None: none) and what was skipped reading them, by the loader's own
    per-rank read."""
    reader = TraceReader(task.trace_dir, tables=(COLLECTIVES,), segment_columns={COLLECTIVES: COLLECTIVE_COLUMNS})
    read = reader.read_rank(task.rank, Path(task.rank_dir))
    mine = [s for s in read.skipped if Path(s.path).name not in SIDE_FILES]  # the first load reported those
    return read.tables.get(COLLECTIVES), mine


def read_part(task: RankSource, window: StepWindow, into: dict | None = None) -> tuple[RankPart, dict[str, PgPartial]]:
    """Pass 1 for one rank: its compact part and its partial of each collective instance (added ``into`` a
    batch's, when given). An unreadable partition is an empty part that names it in ``skipped``, never an
    exception on a worker."""
    return _read_part(task, window, lambda: read_rank_collectives(task), into)


def _read_part(task: RankSource, window: StepWindow, read, into=None) -> tuple[RankPart, dict[str, PgPartial]]:
    if not Path(task.rank_dir).is_dir():  # a worker without the shared filesystem: say so, do not skip silently
        import socket

        part = _empty_part(task.rank)
        part.skipped = [
            Skipped(
                task.rank_dir,
                f"not found on {socket.gethostname()}: its collectives left out (is the trace directory on a "
                "filesystem every Dask worker sees at the same path?)",
            )
        ]
        return part, _partial(part, into)
    try:
        arrow, skipped = read()
        part = _part_of(task, arrow, window)
    except Exception as exc:  # noqa: BLE001 - a damaged partition is skipped and named, the others analysed
        part = _empty_part(task.rank)
        skipped = [Skipped(str(task.rank_dir), f"collectives unreadable, rank left out of them: {exc!r}")]
    part.skipped = skipped + part.skipped
    return part, _partial(part, into)


def _empty_part(rank: int) -> RankPart:
    none = np.zeros(0)
    runs = Runs.of(_NO_INTS)
    return RankPart(rank, [], none.astype("int16"), runs, none, runs, np.packbits(none.astype(bool)), none,
                    _NO_UNMATCHED)  # fmt: skip


def _unmatched_frame(pg, op, nbytes, duration, step, blocking) -> pd.DataFrame:
    """A part's rows matched with no other rank; most ranks have none, and every part then shares one empty
    frame (read only): building a DataFrame per rank was ~1 ms, a tenth of pass 1."""
    if not len(pg):
        return _NO_UNMATCHED
    return pd.DataFrame({"pg": pg, "op": op, "bytes": nbytes, "duration_us": duration, "step": step,
                         "blocking": blocking})  # fmt: skip


_NO_UNMATCHED = pd.DataFrame(
    {
        "pg": pd.Series(dtype=object),
        "op": pd.Series(dtype=object),
        "bytes": pd.Series(dtype="int64"),
        "duration_us": pd.Series(dtype="float64"),
        "step": pd.Series(dtype="int64"),
        "blocking": pd.Series(dtype=bool),
    }
)


def _column(arrow, name: str) -> np.ndarray:
    return arrow.column(name).to_numpy()


def _coded(arrow, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A text column as (int32 codes, names as an object array; null reads as ""), from Arrow's dictionary
    encoding: 20,000 rows of a handful of distinct names never become 20,000 Python strings (that, and
    factorising them, was a third of pass 1)."""
    column = arrow.column(name)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column.cast(pa.string()))
    column = column.unify_dictionaries().combine_chunks() if column.num_chunks > 1 else column.chunk(0)
    # a handful of names: a Python list is cheaper than a pandas round trip (~0.3 ms a column)
    names = np.array(["" if n is None else n for n in column.dictionary.cast(pa.string()).to_pylist()], dtype=object)
    indices = column.indices.fill_null(len(names)) if column.null_count else column.indices
    codes = indices.to_numpy(zero_copy_only=False).astype("int32", copy=False)  # read only: never written to
    if column.null_count:  # a null is one more name, ""
        names = np.append(names, "")
    return codes, names


def _first_seen(codes: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered in order of first appearance, and their names: what pd.factorize gives of the strings
    (equal names from a damaged dictionary merge, as they would as strings)."""
    as_names = names.astype(str)
    merged, canonical = np.unique(as_names, return_inverse=True)
    if not len(codes):
        return np.zeros(0, dtype="int64"), []
    values = canonical[codes]
    if len(merged) > 16:
        first, uniques = pd.factorize(values)
        return first, [str(merged[u]) for u in uniques]
    # a handful of groups or ops: where each first appears, by one pass per name (pd.factorize hashed every
    # row: ~0.5 ms a column, a tenth of pass 1)
    present = np.flatnonzero(np.bincount(values, minlength=len(merged)))
    first_at = np.array([np.argmax(values == v) for v in present])
    uniques = present[np.argsort(first_at, kind="stable")]
    renumber = np.zeros(len(merged), dtype="int64")
    renumber[uniques] = np.arange(len(uniques))
    return renumber[values], [str(merged[u]) for u in uniques]


def _merged(codes: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes into the distinct names (equal names from a damaged dictionary merged, as they would be as
    strings), in any order: the partial's ops are matched by name (``_first_seen``'s order is the groups')."""
    merged, canonical = np.unique(names.astype(str), return_inverse=True)
    return canonical[codes], [str(m) for m in merged]


@dataclass
class RankRows:
    """Collective rows as a part is built from them: numbers as arrays, group and op names as codes into a few
    names (Arrow's dictionaries or a loaded frame's categories: no Python string per row)."""

    step: np.ndarray  # int64
    seq: np.ndarray  # int64
    duration_us: np.ndarray  # float64; NaN: untimed
    start_us: np.ndarray  # float64, on the rank's own clock
    blocking: np.ndarray  # bool
    nbytes: np.ndarray  # int64
    pg: np.ndarray  # int32 codes into pg_names
    pg_names: np.ndarray  # object
    op: np.ndarray  # int32 codes into op_names
    op_names: np.ndarray  # object

    def take(self, rows: np.ndarray) -> RankRows:
        """The rows at ``rows`` (indices), the names shared."""
        return RankRows(self.step[rows], self.seq[rows], self.duration_us[rows], self.start_us[rows],
                        self.blocking[rows], self.nbytes[rows], self.pg[rows], self.pg_names, self.op[rows],
                        self.op_names)  # fmt: skip


def _arrow_rows(arrow) -> RankRows:
    pg, pg_names = _coded(arrow, "pg")
    op, op_names = _coded(arrow, "op")
    return RankRows(
        step=_column(arrow, "step").astype("int64", copy=False),
        seq=_column(arrow, "seq").astype("int64", copy=False),
        duration_us=arrow.column("duration_us").to_numpy(zero_copy_only=False).astype("float64", copy=False),
        start_us=_column(arrow, "start_us").astype("float64"),
        blocking=_column(arrow, "blocking") != 0,
        nbytes=_column(arrow, "bytes").astype("int64", copy=False),
        pg=pg,
        pg_names=pg_names,
        op=op,
        op_names=op_names,
    )


def _frame_rows(coll: pd.DataFrame) -> RankRows:
    """A loaded collectives table (``Trace.collectives``) as RankRows."""
    pg, pg_names = _categories(coll["pg"])
    op, op_names = _categories(coll["op"])
    return RankRows(
        step=coll["step"].to_numpy(dtype="int64"),
        seq=coll["seq"].to_numpy(dtype="int64"),
        duration_us=coll["duration_us"].to_numpy(dtype="float64", na_value=np.nan),
        start_us=coll["start_us"].to_numpy(dtype="float64", na_value=np.nan),
        blocking=coll["blocking"].to_numpy(dtype="int8") != 0,
        nbytes=coll["bytes"].to_numpy(dtype="int64"),
        pg=pg,
        pg_names=pg_names,
        op=op,
        op_names=op_names,
    )


def _categories(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column as ``_coded`` gives it (codes, names; null reads as ""), from its categories."""
    column = column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    codes = column.cat.codes.to_numpy().astype("int32")
    names = np.asarray(column.cat.categories.astype(str), dtype=object)
    if (codes < 0).any():  # a null is one more name, ""
        codes[codes < 0] = len(names)
        names = np.append(names, "")
    return codes, names


def _part_of(task: RankSource, arrow, window: StepWindow) -> RankPart:
    if arrow is None or arrow.num_rows == 0:
        return _empty_part(task.rank)
    cleaned, dropped = clean_rank_tables({COLLECTIVES: arrow}, task.cut_us)
    if COLLECTIVES in cleaned:
        rows = _arrow_rows(cleaned[COLLECTIVES])
        part = _compact_part(task, rows, in_window_array(rows.step, window))
    else:  # every row dropped
        part = _empty_part(task.rank)
    part.dropped = dropped
    part.rows_read = arrow.num_rows
    return part


def _compact_part(task: RankSource, rows: RankRows, keep: np.ndarray) -> RankPart:
    """The rank's part of its ``rows`` where ``keep``: rows cleaned and in the window."""
    p2p = np.array([canonical_op(str(name)) in ("send", "recv") for name in rows.op_names], dtype=bool)
    unmatched_rows = (p2p[rows.op] if len(p2p) else np.zeros(len(rows.seq), dtype=bool)) | (rows.seq < 0)
    matched = keep & ~unmatched_rows
    loose = keep & unmatched_rows
    codes, names = _first_seen(rows.pg[matched], rows.pg_names)
    duration_m = rows.duration_us[matched]
    untimed = np.isnan(duration_m)
    seq_m = rows.seq[matched]
    part = RankPart(
        rank=task.rank,
        pg_names=[str(n) for n in names],
        pg=codes.astype("int8" if len(names) < 2**7 else "int16" if len(names) < 2**15 else "int32"),
        seq=_seq_runs(seq_m, codes, len(names)),
        duration_us=_compact_float(duration_m),
        step=Runs.of(rows.step[matched]),
        blocking=np.packbits(rows.blocking[matched]),
        start_us=rows.start_us[matched][untimed] - task.offset_us,
        unmatched=_unmatched_frame(
            rows.pg_names[rows.pg[loose]],
            rows.op_names[rows.op[loose]],
            rows.nbytes[loose],
            rows.duration_us[loose],
            rows.step[loose],
            rows.blocking[loose],
        ),  # fmt: skip
    )
    # for the partial only, not kept (see _partial); its seqs as read, not decoded again
    part._ops, part._bytes, part._seqs = _merged(rows.op[matched], rows.op_names), rows.nbytes[matched], seq_m
    return part


def _offset_int(values: np.ndarray) -> tuple[int, np.ndarray]:
    """(lo, values - lo) as uint16 when the range fits (a rank's steps, its seqs' distances), else (0, int32 or
    int64 values)."""
    if not len(values):
        return 0, values.astype("int32")
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 2**16:
        return lo, (values - lo).astype("uint16")
    return 0, values.astype("int32") if lo >= -(2**31) and hi < 2**31 else values


def _compact_float(values: np.ndarray) -> np.ndarray:
    """float32 when every value survives the round trip (whole microseconds below 2**24 do), else float64."""
    narrow = values.astype("float32")
    if (narrow == values).all():  # no NaN and every value exact: one comparison (equal_nan's masks cost more)
        return narrow
    return narrow if np.array_equal(narrow.astype("float64"), values, equal_nan=True) else values


@dataclass
class PgPartial:
    """One process group's collective instances as dense arrays over its seq range (a group's sequence numbers
    count up, so the range is about the instances): combining two is elementwise, no hashing."""

    lo: int  # seq of slot 0
    op_names: list[str]
    op: np.ndarray  # int32 codes into op_names (-1: no row)
    transfer_us: np.ndarray  # shortest timed duration (NaN: none timed)
    bytes_max: np.ndarray  # int64
    latest_us: np.ndarray  # latest untimed issue, rank 0's clock (-inf: none)
    ranks: np.ndarray  # int64 rows (0: no instance at this seq)


def _partial(part: RankPart, into: dict[str, PgPartial] | None = None) -> dict[str, PgPartial]:
    """Per process group, per seq, this rank's instance fields; ``into``: added to those partials (of earlier
    ranks of a batch: ``combine_partials`` of them and this rank's, in place), which are returned. Adding a
    rank's rows straight into the batch's arrays spares each rank its own blank arrays and their combination
    (~0.3 ms a rank). Drops the op, size and seq arrays from the part: pass 2 does not need them."""
    ops, nbytes, seqs = (part.__dict__.pop(name, None) for name in ("_ops", "_bytes", "_seqs"))
    out = {} if into is None else into
    if ops is None or not len(part.pg):
        return out
    duration = part.duration_us.astype("float64")
    latest = np.full(len(duration), -np.inf)
    latest[np.isnan(duration)] = part.start_us
    op_codes, op_names = ops
    op_names = [str(o) for o in op_names]
    seqs = part.seqs() if seqs is None else seqs.astype("int64", copy=False)
    for name, rows in zip(part.pg_names, _group_rows(part.pg, len(part.pg_names))):
        seq = seqs[rows]
        lo, hi = int(seq.min()), int(seq.max())
        g = out.get(name)
        if g is not None and (lo < g.lo or hi >= g.lo + len(g.ranks)):  # outside the batch's range: apart
            out[name] = _combine_into(g, _rows_partial(lo, hi, op_names, seq, rows, duration, latest, nbytes,
                                                       op_codes))  # fmt: skip
            continue
        if g is None:
            out[name] = _rows_partial(lo, hi, op_names, seq, rows, duration, latest, nbytes, op_codes)
            continue
        _add_rows(g, seq - g.lo, rows, duration, latest, nbytes, _op_remap(g, op_names)[op_codes[rows]])
    return out


def _rows_partial(lo, hi, op_names, seq, rows, duration, latest, nbytes, op_codes) -> PgPartial:
    g = _blank(lo, list(op_names), hi - lo + 1)
    _add_rows(g, seq - lo, rows, duration, latest, nbytes, op_codes[rows])
    return g


def _add_rows(g: PgPartial, slot, rows, duration, latest, nbytes, ops) -> None:
    np.fmin.at(g.transfer_us, slot, duration[rows])
    np.maximum.at(g.bytes_max, slot, nbytes[rows])
    np.maximum.at(g.latest_us, slot, latest[rows])
    np.add.at(g.ranks, slot, 1)
    g.op[slot] = ops  # the later rank's op wins where ranks disagree, as in _combine_pg


def _op_remap(g: PgPartial, op_names: list[str]) -> np.ndarray:
    """Codes into ``op_names`` as codes into g's op names (those it lacks appended)."""
    index = {n: i for i, n in enumerate(g.op_names)}
    for n in op_names:
        if n not in index:
            index[n] = len(g.op_names)
            g.op_names.append(n)
    return np.array([index[n] for n in op_names], dtype="int32")


def _blank(lo: int, op_names: list[str], size: int) -> PgPartial:
    return PgPartial(
        lo,
        op_names,
        np.full(size, -1, dtype="int32"),
        np.full(size, np.nan),
        np.zeros(size, dtype="int64"),
        np.full(size, -np.inf),
        np.zeros(size, dtype="int64"),
    )


def _combine_pg(a: PgPartial, b: PgPartial) -> PgPartial:
    lo = min(a.lo, b.lo)
    size = max(a.lo + len(a.ranks), b.lo + len(b.ranks)) - lo
    names = list(dict.fromkeys([*a.op_names, *b.op_names]))
    out = _blank(lo, names, size)
    for g in (a, b):
        at = slice(g.lo - lo, g.lo - lo + len(g.ranks))
        out.transfer_us[at] = np.fmin(out.transfer_us[at], g.transfer_us)
        out.bytes_max[at] = np.maximum(out.bytes_max[at], g.bytes_max)
        out.latest_us[at] = np.maximum(out.latest_us[at], g.latest_us)
        out.ranks[at] += g.ranks
        remap = np.array([names.index(n) for n in g.op_names] + [-1], dtype="int32")
        theirs = remap[g.op]
        # every rank issues the same op; where a damaged row says otherwise, the last rank's wins (partials
        # combine in rank order, here and in Dask's trees)
        out.op[at] = np.where(theirs >= 0, theirs, out.op[at])
    return out


def _combine_into(out: PgPartial, g: PgPartial) -> PgPartial:
    """``_combine_pg(out, g)``, in place in ``out`` when its seq range covers g's (every rank of a group issues
    the same collectives: the usual case). Allocating the combination anew for each of 16,384 ranks cost ~19 s."""
    if g.lo < out.lo or g.lo + len(g.ranks) > out.lo + len(out.ranks):
        return _combine_pg(out, g)
    at = slice(g.lo - out.lo, g.lo - out.lo + len(g.ranks))
    np.fmin(out.transfer_us[at], g.transfer_us, out=out.transfer_us[at])
    np.maximum(out.bytes_max[at], g.bytes_max, out=out.bytes_max[at])
    np.maximum(out.latest_us[at], g.latest_us, out=out.latest_us[at])
    out.ranks[at] += g.ranks
    index = {n: i for i, n in enumerate(out.op_names)}
    for n in g.op_names:
        if n not in index:
            index[n] = len(out.op_names)
            out.op_names.append(n)
    remap = np.array([index[n] for n in g.op_names] + [-1], dtype="int32")
    theirs = remap[g.op]
    out.op[at] = np.where(theirs >= 0, theirs, out.op[at])  # as _combine_pg: the later rank's op wins
    return out


def _copy_pg(g: PgPartial) -> PgPartial:
    return PgPartial(g.lo, list(g.op_names), g.op.copy(), g.transfer_us.copy(), g.bytes_max.copy(),
                     g.latest_us.copy(), g.ranks.copy())  # fmt: skip


def combine_partials(*partials: dict[str, PgPartial]) -> dict[str, PgPartial]:
    """Partials of several ranks (or of several combinations) as one: associative, for a tree. The inputs are
    left as they were (Dask may hand the same one to other tasks)."""
    out: dict[str, PgPartial] = {}
    for partial in partials:
        for name, g in partial.items():
            out[name] = _combine_into(out[name], g) if name in out else _copy_pg(g)
    return out


# -- between the passes: the instance table ----------------------------------------------------------------------


class SeqIndex:
    """seq -> row of one process group's instances. A group's sequence numbers count up, so a dense array over
    their range is a few bytes per instance and a lookup is one gather (pass 2's hash lookups were a fifth of
    its time); a sparse range (seqs far apart) keeps a hash index."""

    def __init__(self, seq: np.ndarray):
        self.lo = int(seq.min()) if len(seq) else 0
        span = int(seq.max()) - self.lo + 1 if len(seq) else 0
        self.dense, self.index = None, None
        if span <= 4 * len(seq) + 1024:
            self.dense = np.full(span, -1, dtype="int64")
            self.dense[seq - self.lo] = np.arange(len(seq))
        else:
            self.index = pd.Index(seq)

    def get_indexer(self, seq: np.ndarray) -> np.ndarray:
        """Rows of ``seq`` (-1: not an instance), as pd.Index.get_indexer."""
        if self.dense is None:
            return self.index.get_indexer(seq)
        pos = seq - self.lo
        if len(pos) and pos.min() >= 0 and pos.max() < len(self.dense):  # the usual case: one gather
            return self.dense[pos]
        inside = (pos >= 0) & (pos < len(self.dense))
        out = np.full(len(seq), -1, dtype="int64")
        out[inside] = self.dense[pos[inside]]
        return out


@dataclass
class MatchTable:
    """The collective instances by process group: seq index, shortest duration, latest untimed issue, rows, and
    the (op, pg, size bucket) group of each."""

    by_pg: dict[str, tuple[SeqIndex, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    keys: list[tuple[str, str, int]]  # group id -> (op, pg, bucket)


_INSTANCE_DTYPES = {"pg": object, "seq": "int64", "op": object, "op_name": object, "transfer_us": "float64",
                    "bytes_max": "int64", "latest_us": "float64", "ranks": "int64"}  # fmt: skip


def instance_table(partial: dict[str, PgPartial]) -> pd.DataFrame:
    """The combined partial as comms' instances frame (pg, seq, op, bytes_max, transfer_us, ranks), plus
    latest_us and each instance's group key. Built as arrays, one frame at the end: a frame per group and their
    concatenation take milliseconds whatever the number of instances."""
    columns: dict[str, list] = {name: [] for name in _INSTANCE_DTYPES}
    for name, g in partial.items():
        used = np.flatnonzero(g.ranks > 0)
        ops = g.op[used]
        columns["pg"].append(np.full(len(used), name, dtype=object))
        columns["seq"].append(used + g.lo)
        columns["op"].append(np.asarray(g.op_names, dtype=object)[ops])
        columns["op_name"].append(np.asarray([canonical_op(o) for o in g.op_names], dtype=object)[ops])
        columns["transfer_us"].append(g.transfer_us[used])
        columns["bytes_max"].append(g.bytes_max[used])
        columns["latest_us"].append(g.latest_us[used])
        columns["ranks"].append(g.ranks[used])
    inst = pd.DataFrame(
        {
            name: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
            for (name, dtype), parts in zip(_INSTANCE_DTYPES.items(), columns.values())
        }
    )
    inst["bucket"] = size_bucket(inst["bytes_max"].to_numpy())
    return inst


def match_table(inst: pd.DataFrame) -> MatchTable:
    """The instances by group, numbered in (op, pg, bucket) order. Factorised column by column: pandas' groupby
    costs ~5 ms whatever the number of instances, more than the rest of a small trace's waits."""
    op_codes, op_names = pd.factorize(inst["op_name"].astype(str), sort=True)
    pg_codes, pg_names = pd.factorize(inst["pg"].astype(str), sort=True)
    buckets, bucket_codes = np.unique(inst["bucket"].to_numpy(dtype="int64"), return_inverse=True)
    key = (op_codes.astype("int64") * len(pg_names) + pg_codes) * len(buckets) + bucket_codes
    distinct, group = np.unique(key, return_inverse=True)  # ascending: by op, then pg, then bucket
    op_of, rest = np.divmod(distinct, len(pg_names) * len(buckets))
    pg_of, bucket_of = np.divmod(rest, len(buckets))
    keys = [(str(op_names[o]), str(pg_names[p]), int(buckets[b])) for o, p, b in zip(op_of, pg_of, bucket_of)]
    seq, ranks = inst["seq"].to_numpy(dtype="int64"), inst["ranks"].to_numpy(dtype="int64")
    transfer, latest = inst["transfer_us"].to_numpy(dtype="float64"), inst["latest_us"].to_numpy(dtype="float64")
    by_pg = {}
    for code, pg in enumerate(pg_names):
        rows = np.flatnonzero(pg_codes == code)
        by_pg[str(pg)] = (SeqIndex(seq[rows]), transfer[rows], latest[rows], ranks[rows], group[rows])
    return MatchTable(by_pg, keys)


# -- pass 2 ----------------------------------------------------------------------------------------------------


@dataclass
class CollectiveSums:
    """What the analyses read of the collectives, for some ranks: merges with ``merge_sums``."""

    step_cells: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)  # rank, steps, wait_us
    arrivals: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (arrived last, rows)
    members: dict[str, set[int]] = field(default_factory=dict)
    groups: dict[tuple[str, str, int], OpGroup] = field(default_factory=dict)  # row sums; unmatched instances too


def finish_part(part: RankPart, match: MatchTable) -> CollectiveSums:
    """Pass 2 for one rank: each row's wait for the last rank to arrive, reduced."""
    sums = CollectiveSums()
    n = len(part.pg)
    duration = part.duration_us.astype("float64")
    wait = np.zeros(n)
    ranks = np.zeros(n, dtype="int64")
    group = np.zeros(n, dtype="int64")
    timed = ~np.isnan(duration)
    start = np.full(n, np.nan)
    start[~timed] = part.start_us
    seqs = part.seqs()
    for name, rows in zip(part.pg_names, _group_rows(part.pg, len(part.pg_names))):
        index, transfer, latest, inst_ranks, inst_group = match.by_pg[name]
        at = index.get_indexer(seqs[rows])
        wait[rows] = np.where(timed[rows], duration[rows] - transfer[at], latest[at] - start[rows])
        ranks[rows], group[rows] = inst_ranks[at], inst_group[at]
    is_last = (wait == 0) & (ranks > 1)
    if not np.isfinite(wait).all():  # untimed rows of an instance nobody timed; nan_to_num alone costs more
        wait = np.nan_to_num(wait, nan=0.0)
    loose = part.unmatched
    steps, waits, blocking = part.steps(), wait, part.blockings()
    if len(loose):  # matched with no one: nobody to wait for
        steps = np.concatenate([steps, loose["step"].to_numpy(dtype="int64")])
        waits = np.concatenate([wait, np.zeros(len(loose))])
        blocking = np.concatenate([blocking, loose["blocking"].to_numpy(dtype=bool)])
    if len(steps):
        sums.step_cells.append((part.rank, *_per_step(steps, waits, blocking)))
        sums.arrivals[part.rank] = (int(is_last.sum()), len(steps))
    for name in {*part.pg_names, *(loose["pg"].astype(str) if len(loose) else ())}:
        sums.members[name] = {part.rank}
    for g in np.flatnonzero(np.bincount(group)):  # the groups present, ascending: np.unique hashed every row
        rows = group == g
        d = duration[rows & timed]
        key = match.keys[g]
        sums.groups[key] = OpGroup(
            *key, durations=_value_counts(d), rows=int(rows.sum()), wait_sum_us=float(wait[rows].sum())
        )
    for key, rows in _loose_groups(loose).items():
        d = rows["duration_us"].to_numpy(dtype="float64")
        timed_d = d[~np.isnan(d)]
        one = OpGroup(
            *key,
            count=len(rows),
            ranks_max=1,
            transfer=ValueCounts.of(timed_d),
            bytes_max=ValueCounts.of(rows["bytes"].to_numpy()),
            durations=ValueCounts.of(timed_d),
            rows=len(rows),
        )
        _add_group(sums.groups, one)
    return sums


def _per_step(steps: np.ndarray, waits: np.ndarray, blocking: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ReducedWaits.per_rank_step`` for one rank: blocking waits add up, overlapping asynchronous ones count once."""
    distinct, cell = _distinct(steps)
    total = np.bincount(cell[blocking], weights=waits[blocking], minlength=len(distinct))
    return distinct, total + _cell_max(cell[~blocking], waits[~blocking], len(distinct))


def _cell_max(cell: np.ndarray, values: np.ndarray, cells: int) -> np.ndarray:
    """The largest of ``values`` in each cell (0 where none): by one reduceat where the cells come in order (a
    rank's rows are in step order), else np.maximum.at (several times slower)."""
    out = np.zeros(cells)
    if not len(cell):
        return out
    if cell[0] >= 0 and (len(cell) == 1 or (np.diff(cell) >= 0).all()):
        starts = np.flatnonzero(np.concatenate([[True], cell[1:] != cell[:-1]]))
        out[cell[starts]] = np.maximum(np.maximum.reduceat(values, starts), 0.0)
        return out
    np.maximum.at(out, cell, values)
    return out


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of integers; by counting when their range is about their
    number (a rank's steps: 20 rows a step), which is several times cheaper than unique's sort."""
    if not len(values):
        return np.unique(values, return_inverse=True)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 4 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    offset = values - lo
    present = np.bincount(offset, minlength=hi - lo + 1) > 0
    index = np.cumsum(present) - 1
    return np.flatnonzero(present) + lo, index[offset]


def _value_counts(values: np.ndarray) -> ValueCounts:
    """``ValueCounts.of(values)`` by hashing (pandas' value_counts) and sorting only the distinct values: a
    rank's ~20,000 durations have ~1,000 distinct values, and np.unique's sort of all of them was 0.7 ms a
    group and rank (0.3 ms so). Small arrays, NaN or -0.0 (which unique and a hash may spell differently):
    np.unique."""
    values = np.asarray(values, dtype="float64")
    if len(values) < 1024 or not np.isfinite(values).all() or np.signbit(values[values == 0]).any():
        return ValueCounts.of(values)
    counted = _whole_counts(values)
    if counted is not None:
        return counted
    counted = pd.Series(values).value_counts(sort=False)
    distinct = counted.index.to_numpy(dtype="float64")
    order = np.argsort(distinct, kind="stable")
    return ValueCounts(distinct[order], counted.to_numpy(dtype="int64")[order])


def _whole_counts(values: np.ndarray) -> ValueCounts | None:
    """``ValueCounts.of(values)`` of finite whole numbers (durations in whole microseconds) by counting: the bulk
    within a few times their number of the smallest, by one bincount, and the rest (a step's first collective,
    far longer) by np.unique; None when a value is not whole. Hashing every value was ~0.4 ms a group and rank,
    a third of pass 2."""
    whole = np.rint(values)
    if not np.array_equal(whole, values) or abs(whole).max() >= 2**53:
        return None
    lo = whole.min()
    offset = whole - lo
    near = offset < len(values) + 1024
    counts = np.bincount(offset[near].astype("int64"))
    present = np.flatnonzero(counts)
    bulk = ValueCounts(present.astype("float64") + lo, counts[present].astype("int64"))
    if near.all():
        return bulk
    far = ValueCounts.of(values[~near])  # every one above the bulk's: the two lists in order, nothing to merge
    return ValueCounts(np.concatenate([bulk.values, far.values]), np.concatenate([bulk.counts, far.counts]))


def _loose_groups(loose: pd.DataFrame) -> dict[tuple[str, str, int], pd.DataFrame]:
    if loose.empty:
        return {}
    keys = pd.DataFrame(
        {
            "op_name": loose["op"].astype(str).map(canonical_op),
            "pg": loose["pg"].astype(str),
            "bucket": size_bucket(loose["bytes"].to_numpy()),
        }
    )
    return {(str(o), str(p), int(b)): loose.loc[rows.index] for (o, p, b), rows in keys.groupby(list(keys.columns))}


def _add_group(groups: dict, g: OpGroup) -> None:
    key = (g.op, g.pg, g.bucket)
    if key not in groups:
        groups[key] = g
        return
    a = groups[key]
    groups[key] = OpGroup(
        *key,
        count=a.count + g.count,
        ranks_max=max(a.ranks_max, g.ranks_max),
        transfer=_merge_vc(a.transfer, g.transfer),
        bytes_max=_merge_vc(a.bytes_max, g.bytes_max),
        durations=_merge_vc(a.durations, g.durations),
        rows=a.rows + g.rows,
        wait_sum_us=a.wait_sum_us + g.wait_sum_us,
    )


def _merge_vc(a: ValueCounts | None, b: ValueCounts | None) -> ValueCounts | None:
    if a is None or b is None:
        return a if b is None else b
    return ValueCounts.merged([a, b])


def merge_sums(*parts: CollectiveSums) -> CollectiveSums:
    """Sums of several ranks as one: associative, for a tree."""
    out = CollectiveSums()
    for p in parts:
        out.step_cells.extend(p.step_cells)
        out.arrivals.update(p.arrivals)
        for name, ranks in p.members.items():
            out.members.setdefault(name, set()).update(ranks)
    keys = {k for p in parts for k in p.groups}
    for key in keys:
        found = [p.groups[key] for p in parts if key in p.groups]
        out.groups[key] = OpGroup(
            *key,
            count=sum(g.count for g in found),
            ranks_max=max(g.ranks_max for g in found),
            transfer=ValueCounts.merged([g.transfer for g in found if g.transfer is not None]),
            bytes_max=ValueCounts.merged([g.bytes_max for g in found if g.bytes_max is not None]),
            durations=ValueCounts.merged([g.durations for g in found if g.durations is not None]),
            rows=sum(g.rows for g in found),
            wait_sum_us=sum(g.wait_sum_us for g in found),
        )
    return out


def reduced_waits(sums: CollectiveSums, inst: pd.DataFrame) -> ReducedWaits | None:
    """The merged sums and the instance table as comms' ReducedWaits (None: no collective in the window)."""
    rows = sum(r for _, r in sums.arrivals.values())
    if rows == 0:
        return None
    groups = dict(sums.groups)
    for key, members in inst.groupby(["op_name", "pg", "bucket"], sort=False):
        key = (str(key[0]), str(key[1]), int(key[2]))
        timed = members["transfer_us"].dropna().to_numpy()
        _add_group(
            groups,
            OpGroup(
                *key,
                count=len(members),
                ranks_max=int(members["ranks"].max()),
                transfer=ValueCounts.of(timed),
                bytes_max=ValueCounts.of(members["bytes_max"].to_numpy()),
            ),
        )
    cells = sorted(sums.step_cells, key=lambda c: c[0])
    index = pd.MultiIndex.from_arrays(
        [np.concatenate([np.full(len(s), r, dtype="int64") for r, s, _ in cells]),
         np.concatenate([s for _, s, _ in cells])],
        names=["rank", "step"],
    )  # fmt: skip
    per_rank_step = pd.Series(np.concatenate([w for _, _, w in cells]), index=index)
    size = max(sums.arrivals) + 1
    last, counts = np.zeros(size), np.zeros(size, dtype="int64")
    for rank, (arrived_last, n) in sums.arrivals.items():
        last[rank], counts[rank] = arrived_last, n
    for g in groups.values():  # a group of only matched rows has no instance-level fields yet, and vice versa
        g.transfer = g.transfer or ValueCounts.of(np.zeros(0))
        g.bytes_max = g.bytes_max or ValueCounts.of(np.zeros(0))
        g.durations = g.durations or ValueCounts.of(np.zeros(0))
    return ReducedWaits(
        per_rank_step=per_rank_step,
        last_arrivals=last,
        rows_per_rank=counts,
        groups=[groups[k] for k in sorted(groups)],
        instances=inst[["pg", "seq", "op", "bytes_max", "transfer_us", "ranks"]],
        members={pg: sorted(ranks) for pg, ranks in sorted(sums.members.items())},
        rows=rows,
    )


# -- the two stages on the engine ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collectives:
    """The collectives as a two-stage analysis (``engine.run_two_stage``): stage 1 ``read_part`` (each rank's
    part kept), between them the instance table and its match table (the broadcast), stage 2 ``finish_part``;
    the result is (merged sums, instance table, what the reads skipped and dropped)."""

    window: StepWindow

    def first(self, sources: list[RankSource]) -> tuple[list[RankPart], tuple[dict, ReadNotes]]:
        """Pass 1 for a batch of ranks: their parts, their partials combined and what their reads skipped and
        dropped."""
        partial = {}
        parts = [self.part(source, partial) for source in sources]
        skipped = [(p.rank, s) for p in parts for s in p.skipped]
        notes = ReadNotes(skipped, sum((p.dropped for p in parts), Dropped()), sum(p.rows_read for p in parts))
        return parts, (partial, notes)

    def part(self, source: RankSource, partial: dict[str, PgPartial]) -> RankPart:
        """The rank's part, its partial added to ``partial``."""
        return read_part(source, self.window, into=partial)[0]

    def combine(self, *partials: tuple[dict, ReadNotes]) -> tuple[dict, ReadNotes]:
        return combine_partials(*(p for p, _ in partials)), sum((notes for _, notes in partials), ReadNotes())

    def between(self, partial: tuple[dict, ReadNotes]) -> tuple[tuple[pd.DataFrame, ReadNotes], MatchTable]:
        combined, notes = partial
        inst = instance_table(combined)
        return (inst, notes), match_table(inst)

    def second(self, part: RankPart, match: MatchTable) -> CollectiveSums:
        return finish_part(part, match)

    def combine2(self, *sums: CollectiveSums) -> CollectiveSums:
        return merge_sums(*sums)

    def finish(self, state: tuple[pd.DataFrame, ReadNotes], sums: CollectiveSums):
        inst, notes = state
        return sums, inst, notes


@dataclass(frozen=True)
class LoadedCollectives(Collectives):
    """``Collectives`` over a loaded table: each rank's part built from its rows there (``by_rank``: their
    indices into ``rows``, those in ``window``), which the loader has cleaned, instead of from its files."""

    rows: RankRows
    by_rank: dict[int, np.ndarray]

    def part(self, source: RankSource, partial: dict[str, PgPartial]) -> RankPart:
        rows = self.rows.take(self.by_rank[source.rank])
        part = _compact_part(source, rows, np.ones(len(rows.seq), dtype=bool))
        _partial(part, partial)
        return part


def loaded_waits(
    coll: pd.DataFrame, window: StepWindow | None, clock_offsets_us: dict[int, float] | None = None
) -> ReducedWaits | None:
    """The collectives' waits of a loaded table (``Trace.collectives``) in ``window`` (None: every row), by the
    two stages ``collectives_reducer`` runs over the ranks' files, inline; untimed rows' issue times on rank 0's
    clock by ``clock_offsets_us``. None: no collective in the window."""
    keep = np.ones(len(coll), dtype=bool) if window is None else in_window(coll["step"], window).to_numpy()
    chosen = np.flatnonzero(keep)
    if not len(chosen):
        return None
    rank = coll["rank"].to_numpy(dtype="int64")
    chosen = chosen[np.argsort(rank[chosen], kind="stable")]  # each rank's rows together, in their order
    ranks, first = np.unique(rank[chosen], return_index=True)
    by_rank = dict(zip(ranks.tolist(), np.split(chosen, first[1:])))
    analysis = LoadedCollectives(window, _frame_rows(coll), by_rank)
    offsets = clock_offsets_us or {}
    sources = [RankSource("", r, "", None, float(offsets.get(r, 0.0))) for r in by_rank]
    sums, inst, _ = run_two_stage(analysis, sources)
    return reduced_waits(sums, inst)
