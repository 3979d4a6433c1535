"""The collectives reduced rank by rank (diag.analysis.collective_waits) give the report of the whole table loaded in
memory: on synthetic runs with planted stragglers, on the bundled sample runs (their golden reports), on damaged
traces (the loader's notes about skipped and dropped rows included), and when ranks are read again instead of
held between the passes.

Tolerance: floats equal to 1e-9 relative (tests/analysis/golden.differences); sums are added in
another order, percentiles are exact (value counts, numpy's own interpolation)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from diag.analysis import collective_waits
from diag.analysis.comms import ValueCounts
from tests.analysis.golden import differences
from tests.analysis.helpers import REPO, cli_json, make_trace, run_cli


def test_value_counts_percentiles_are_numpys():
    rng = np.random.default_rng(3)
    for values in (rng.integers(0, 50, 1001).astype(float), rng.normal(size=77), np.array([4.0]), np.arange(10.0)):
        halves = [ValueCounts.of(values[: len(values) // 2]), ValueCounts.of(values[len(values) // 2 :])]
        counts = ValueCounts.merged(halves)
        for q in (0, 1, 25, 50, 99, 100):
            assert counts.percentile(q) == np.percentile(values, q)
        assert counts.sum() == pytest.approx(values.sum(), rel=1e-12)


def _same_counts(a: ValueCounts, b: ValueCounts) -> bool:
    return (
        a.values.dtype == b.values.dtype
        and a.counts.dtype == b.counts.dtype
        and np.array_equal(a.values, b.values)
        and np.array_equal(a.counts, b.counts)
    )


def test_fast_value_counts_equal_numpys_unique():
    """_value_counts' paths (counting whole microseconds, a bulk plus far outliers, hashing) against np.unique."""
    rng = np.random.default_rng(5)
    cases = [
        rng.integers(500, 700, 10_000).astype(float),  # whole microseconds, the usual case: counted
        np.concatenate([rng.integers(500, 700, 9_500), rng.integers(100_000, 200_000, 500)]).astype(float),  # outliers
        np.concatenate([rng.integers(-50, 50, 3_000), [2.0**40, -(2.0**40)]]),
        np.full(3_000, 7.0),
        rng.random(5_000) * 1_000,  # not whole: hashed
        np.concatenate([rng.integers(0, 9, 2_000).astype(float), [-0.0]]),  # -0.0: numpy's own unique
    ]
    for values in cases:
        assert _same_counts(collective_waits._value_counts(values), ValueCounts.of(values))


def test_cell_max_equals_maximum_at():
    rng = np.random.default_rng(6)
    for cell in (np.sort(rng.integers(0, 50, 2_000)), rng.integers(0, 50, 2_000), np.array([3]), np.zeros(0, int)):
        values = rng.normal(size=len(cell)) * 100
        expected = np.zeros(60)
        np.maximum.at(expected, cell, values)
        assert np.array_equal(collective_waits._cell_max(cell, values, 60), expected)


def test_a_parts_runs_give_back_its_seqs_steps_and_blocking_flags():
    """A rank's seqs (gaps, groups interleaved, out of order, negative, past uint16's range), steps and blocking
    flags come back exactly from their compact forms, with fewer bytes where they are the usual runs."""
    rng = np.random.default_rng(5)
    for case in range(60):
        n = int(rng.integers(0, 3000))
        groups = int(rng.integers(1, 5))
        pg = rng.integers(0, groups, n).astype("int8")
        seq = np.empty(n, dtype="int64")
        for code in range(groups):
            rows = np.flatnonzero(pg == code)
            seq[rows] = int(rng.integers(-5, 1 << 20)) + np.cumsum(rng.choice([1, 1, 1, 2, 70_000, -3], len(rows)))
        if case % 5 == 0:
            rng.shuffle(seq)
        steps = np.sort(rng.integers(0, max(n // 20, 1), n)) if case % 3 else rng.integers(-9, 1 << 33, n)
        blocking = rng.random(n) < 0.7
        part = collective_waits.RankPart(
            rank=0, pg_names=[str(g) for g in range(groups)], pg=pg, seq=collective_waits._seq_runs(seq, pg, groups),
            duration_us=np.zeros(n), step=collective_waits.Runs.of(steps), blocking=np.packbits(blocking),
            start_us=np.zeros(0), unmatched=collective_waits._NO_UNMATCHED,
        )  # fmt: skip
        assert np.array_equal(part.seqs(), seq) and np.array_equal(part.steps(), steps), case
        assert np.array_equal(part.blockings(), blocking), case
    usual = collective_waits.Runs.of(np.repeat(np.arange(100, 1000), 20))
    assert np.array_equal(usual.decode(), np.repeat(np.arange(100, 1000), 20)) and usual.nbytes == 900 * 4


def test_seq_index_lookups_inside_and_outside_the_range():
    index = collective_waits.SeqIndex(np.array([10, 11, 13, 14]))
    assert index.get_indexer(np.array([13, 10, 14])).tolist() == [2, 0, 3]
    assert index.get_indexer(np.array([9, 12, 14, 99])).tolist() == [-1, -1, 3, -1]


def _rank_part(rank: int, seqs: np.ndarray, ops: list[str], rng) -> collective_waits.RankPart:
    """A rank's compact part as pass 1 leaves it (its ops and sizes still attached), one group "g"."""
    n = len(seqs)
    duration = rng.integers(1, 900, n).astype("float64")
    duration[::5] = np.nan  # untimed rows: their issue times count
    part = collective_waits.RankPart(
        rank=rank, pg_names=["g"], pg=np.zeros(n, "int8"), seq=collective_waits._seq_runs(seqs, np.zeros(n), 1),
        duration_us=duration, step=collective_waits.Runs.of(np.zeros(n, "int64")),
        blocking=np.packbits(np.zeros(n, bool)), start_us=rng.normal(size=int(np.isnan(duration).sum())),
        unmatched=collective_waits._NO_UNMATCHED,
    )  # fmt: skip
    part._ops = (rng.integers(0, len(ops), n), ops)
    part._bytes = rng.integers(0, 1 << 20, n)
    return part


def test_partials_added_into_a_batch_equal_partials_combined():
    """A batch's partial built rank by rank in place equals the ranks' partials combined, including a rank whose
    seqs reach outside the range so far (combined apart) and ranks that disagree on an instance's op."""
    from diag.analysis.collective_waits import _partial, combine_partials

    seq_ranges = [np.arange(100, 300), np.arange(100, 300), np.arange(50, 400, 2), np.arange(120, 200)]
    ops = [["allreduce", "broadcast"], ["broadcast", "allreduce"], ["allreduce"], ["reduce_scatter", "allreduce"]]

    def parts():
        rng = np.random.default_rng(11)
        return [_rank_part(rank, seqs, o, rng) for rank, (seqs, o) in enumerate(zip(seq_ranges, ops))]

    expected = combine_partials(*[_partial(p) for p in parts()])["g"]
    into: dict = {}
    for part in parts():
        _partial(part, into)
    got = into["g"]
    assert got.lo == expected.lo and len(got.ranks) == len(expected.ranks)
    for name in ("transfer_us", "bytes_max", "latest_us", "ranks"):
        assert np.array_equal(getattr(got, name), getattr(expected, name), equal_nan=True), name
    names = lambda g: [g.op_names[c] if c >= 0 else None for c in g.op]  # noqa: E731
    assert names(got) == names(expected)


def test_nothing_usable_is_the_same_clear_error_on_both_paths(tmp_path):
    """Empty rank directories, or manifests alone: the message says which (before: "every rank directory is
    empty" of directories holding a manifest)."""
    for rank in range(2):
        (tmp_path / f"rank{rank:05d}").mkdir()
    for flag in ("--in-memory", "--partitioned"):
        result = run_cli(tmp_path, "--no-cache", flag)
        assert result.exit_code == 2  # an input error (docs/cli.md)
        assert f"nothing in {tmp_path} could be analysed" in result.output
    for rank_dir in sorted((REPO / "sample_traces" / "straggler").glob("rank*"))[:2]:
        shutil.copy(rank_dir / "manifest.json", tmp_path / rank_dir.name)
    for flag in ("--in-memory", "--partitioned"):
        result = run_cli(tmp_path, "--no-cache", flag)
        assert result.exit_code == 2 and "holding only manifest.json" in result.output
        assert "is empty" not in result.output


def test_a_trace_of_collectives_only_is_analysed_on_both_paths(tmp_path):
    """Ranks whose steps and memory files are gone: a report (no step window, so no collective in it), not
    "nothing could be analysed", on both paths."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "sample_traces" / "straggler", run)
    for table in ("steps.csv", "memory.csv"):
        for path in run.glob(f"rank*/{table}"):
            path.unlink()
    old, new = cli_json(run, "--in-memory"), cli_json(run, "--partitioned")
    assert new["run"]["ranks_found"] == [0, 1, 2]
    assert differences(old, new) == []


def test_partitioned_report_is_cached_and_read_back(tmp_path):
    """A repeat with the same options reads the report (the issue's repeat <= 10 s), though no tables were
    cached; the cached report equals the computed one."""
    make_trace(tmp_path, ranks=8, steps=30)
    first = run_cli(tmp_path, "--format", "json", "--partitioned")
    second = run_cli(tmp_path, "--format", "json", "--partitioned")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert "report read from the cache" in second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)
