"""The collectives reduced rank by rank (diag.analysis.partitioned) give the report of the whole table loaded in
memory: on synthetic runs with planted stragglers, on the bundled sample runs (their golden reports), on damaged
traces (the loader's notes about skipped and dropped rows included), and when ranks are read again instead of
held between the passes.

Tolerance: floats equal to 1e-9 relative (tests/analysis/golden.differences); sums are added in
another order, percentiles are exact (value counts, numpy's own interpolation)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from diag import processes as processes_module
from diag.analysis import engine as engine_module
from diag.analysis import partitioned as partitioned_module
from diag.analysis.partitioned import (
    analyze_partitioned,
    collectives_reducer,
    load_without_collectives,
)
from diag.analysis.report import analyze
from diag.processes import Workers
from diag.trace.loader import TraceError, load
from tests.analysis.golden import GOLDEN, PLACEHOLDER, SAMPLE_RUNS, differences
from tests.analysis.helpers import REPO, analyze_in_subprocess, make_trace, run_cli, synthetic

SYNTHETIC_RANKS = 64
SYNTHETIC_STEPS = 120


def in_memory(path: Path, **options) -> dict:
    return analyze(load(path), **options).to_dict()


def partitioned(path: Path, **options) -> dict:
    return analyze_partitioned(path, **options).to_dict()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = tmp_path_factory.mktemp("partitioned")
    plants = synthetic.Plants.with_health(SYNTHETIC_RANKS, SYNTHETIC_STEPS)
    make_trace(path, ranks=SYNTHETIC_RANKS, steps=SYNTHETIC_STEPS, plants=plants)
    return path, plants


@pytest.mark.slow
def test_synthetic_run_with_planted_stragglers_same_report(planted):
    path, plants = planted
    old, new = in_memory(path), partitioned(path)
    assert differences(old, new) == []
    persistent = {s["rank"]: s["cause"] for s in new["stragglers"] if s["persistent"]}
    assert persistent == {
        plants.compute_straggler: "compute",
        plants.data_straggler: "data",
        plants.throttled: "throttle",
    }
    assert new["comms"]["collectives"] and new["comms"]["per_rank"]  # the reduced sections are not empty
    health = new["health"]  # read rank by rank, in two stages
    assert [(d["rank"], d["value_name"]) for d in health["departures"]] == [(plants.grad_departs, "grad_norm")]
    assert health["divergence"]["ranks"] == [plants.diverged[0]]
    assert [s["ranks"] for s in health["spikes"]] == [[plants.loss_spike[0]]]


@pytest.mark.slow
def test_a_step_range_gives_the_same_report(planted):
    path, _ = planted
    assert differences(in_memory(path, steps="30:90"), partitioned(path, steps="30:90")) == []


def test_health_reads_the_ranks_files_only_when_the_load_saw_a_value(tmp_path, monkeypatch):
    """The load leaves the loss, gradient norm and fingerprint out and says whether some rank held one: without,
    the health analysis reads no rank's steps again; with, it does. Either way the in-memory report."""
    without, with_values = tmp_path / "without", tmp_path / "with"
    synthetic.generate(without, 8, 20, 2, trace_format=2)
    synthetic.generate(with_values, 8, 20, 2, synthetic.Plants.with_health(8, 20), trace_format=2)
    assert ("steps", "loss") not in load_without_collectives(without, analysed_columns_only=True).left_out_values
    assert ("steps", "loss") in load_without_collectives(with_values, analysed_columns_only=True).left_out_values
    tables_read = []
    read_shard = engine_module.read_shard

    def spy(sources, columns, *args):
        tables_read.append(set(columns))
        return read_shard(sources, columns, *args)

    monkeypatch.setattr(engine_module, "read_shard", spy)
    for path, reads_steps in ((without, False), (with_values, True)):
        tables_read.clear()
        report = partitioned(path, workers=1)
        assert tables_read and all(("steps" in t) == reads_steps for t in tables_read)
        assert ("health" in report) == reads_steps
        assert differences(in_memory(path), report) == []


def test_ranks_read_again_instead_of_held_give_the_same_report(planted, monkeypatch):
    """With no memory for parts between the passes, every rank is read twice: same report."""
    path, _ = planted
    trace = load_without_collectives(path)
    monkeypatch.setattr(engine_module, "HELD_BYTES_MAX", 0)
    reread = analyze(trace, reduce_collectives=collectives_reducer(trace)).to_dict()
    assert differences(partitioned(path), reread) == []


@pytest.mark.slow
def test_worker_processes_give_the_same_report(planted, monkeypatch):
    """The passes in two worker processes (the default from PROCESS_MIN_RANKS ranks on a machine with two cores):
    the report of the whole tables in memory, whole window and a step range."""
    path, plants = planted
    monkeypatch.setattr(processes_module, "PROCESS_MIN_RANKS", 1)
    monkeypatch.setattr(processes_module, "default_workers", lambda: 2)
    assert processes_module.worker_count(SYNTHETIC_RANKS) == 2
    new = partitioned(path)
    assert differences(in_memory(path), new) == []
    assert plants.compute_straggler in {s["rank"] for s in new["stragglers"]}
    assert differences(in_memory(path, steps="30:90"), partitioned(path, steps="30:90")) == []


@pytest.mark.slow
@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_sample_runs_partitioned_equal_their_golden_reports(run):
    """`diag analyze --partitioned` on the bundled runs (pipeline: send/recv matched with no one; hang: unfinished
    collectives known by issue time only) prints the golden report of the in-memory path."""
    trace_dir = REPO / "sample_traces" / run
    out = analyze_in_subprocess(trace_dir, "--partitioned")
    actual = json.loads(out.replace(str(trace_dir), PLACEHOLDER))
    expected = json.loads((GOLDEN / f"{run}.report.json").read_text())
    assert differences(expected, actual) == []


def _damage(path: Path) -> None:
    """Corrupt rows, rows with start and duration swapped, a table that is a FIFO, and a second run appended to
    one rank's files: what the loader skips, drops and says."""
    rank1 = path / "rank00001" / "collectives.csv"
    with rank1.open("a") as f:
        f.write("3,0,not-a-number,all_reduce,1,float32,,5,6,1,py\n")  # corrupt
        f.write("garbage line\n")
    rank2 = path / "rank00002" / "collectives.csv"
    lines = rank2.read_text().splitlines()
    fields = lines[5].split(",")
    fields[7], fields[8] = fields[8], fields[7]  # start and duration swapped: a duration of ~57 years
    lines[5] = ",".join(fields)
    rank2.write_text("\n".join(lines) + "\n")
    rank3 = path / "rank00003" / "collectives.csv"
    rank3.unlink()
    os.mkfifo(rank3)


@pytest.mark.slow
def test_damaged_trace_same_report_and_same_notes(tmp_path):
    make_trace(tmp_path, ranks=8, steps=60)
    _damage(tmp_path)
    old, new = in_memory(tmp_path), partitioned(tmp_path)
    reasons = [s["reason"] for s in new["run"]["skipped"]]
    assert any("corrupt rows" in r for r in reasons)
    assert any(r.startswith("collectives: rows with a negative duration") for r in reasons)
    assert any("not a regular file" in r for r in reasons)
    assert differences(old, new) == []


@pytest.mark.slow
def test_second_run_appended_same_report(tmp_path):
    """A job run twice into the same directory: the earlier run's collectives are left out per partition, and
    counted in the loader's note as when the whole table is loaded."""
    first, second = tmp_path / "first", tmp_path / "second"
    make_trace(first, ranks=6, steps=40, seed=1)
    make_trace(second, ranks=6, steps=50, seed=2)
    for rank_dir in sorted(second.glob("rank*")):
        for table in ("steps.csv", "collectives.csv", "memory.csv"):
            later = (rank_dir / table).read_text().splitlines(keepends=True)[2:]  # without marker and header
            text = "".join(later)
            # shift the second run after the first: step numbers start again, time goes on
            with (first / rank_dir.name / table).open("a") as f:
                f.write(text.replace("1795", "1796"))
    old, new = in_memory(first), partitioned(first)
    note = next(s for s in new["run"]["skipped"] if "step numbers start again" in s["reason"])
    assert note["lines"] > 6 * 40  # steps and collectives rows of the earlier run
    assert differences(old, new) == []


def _same_trace(a, b) -> None:
    """Two loads of one trace hold the same frames (values and dtypes, exactly) and the same everything else."""
    import pandas as pd

    for name in ("steps", "phases", "collectives", "memory", "telemetry", "microbatches", "events", "heartbeats"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert [(s.path, s.reason, s.lines) for s in a.skipped] == [(s.path, s.reason, s.lines) for s in b.skipped]
    assert a.manifests == b.manifests and a.run_id == b.run_id and a.world_size == b.world_size
    assert (a.ranks_found, a.ranks_missing) == (b.ranks_found, b.ranks_missing)
    assert a.earlier_run_cuts_us == b.earlier_run_cuts_us and a.memory_deep == b.memory_deep
    assert {r: vars(log) for r, log in a.nccl_logs.items()} == {r: vars(log) for r, log in b.nccl_logs.items()}


def _wide_wait(path: Path, rank: int) -> None:
    """One rank's data waits over 2^31 us: its share's steps stay int64 where the others narrow to int32."""
    steps = path / f"rank{rank:05d}" / "steps.csv"
    marker, header, *rows = steps.read_text().splitlines()
    rows = [",".join(f if i != 3 else str(3_000_000_000 + int(f)) for i, f in enumerate(r.split(","))) for r in rows]
    steps.write_text("\n".join([marker, header, *rows]) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("piece_ranks", [partitioned_module.STEPS_PIECE_RANKS, 2, 1])
def test_worker_processes_load_the_same_trace(tmp_path, monkeypatch, piece_ranks):
    """The load in a pool of worker processes (each worker reads its share of the ranks, the steps sent column by
    column) gives the Trace of load_without_collectives frame for frame: on a run with corrupt step rows, a FIFO for a table,
    a second run appended and one rank whose waits do not fit int32 (three workers: shares of 3, 3 and 2 ranks), and on the pipeline and hang
    sample runs (phases, microbatches, events, NCCL logs). A worker converts its steps ``piece_ranks`` ranks at a
    time: one piece a share, or several, one of them int64 beside int32 ones."""
    monkeypatch.setattr(partitioned_module, "STEPS_PIECE_RANKS", piece_ranks)  # before the workers are forked
    damaged = tmp_path / "damaged"
    make_trace(damaged, ranks=8, steps=40, seed=1)
    later = tmp_path / "later"
    make_trace(later, ranks=8, steps=30, seed=2)
    for rank_dir in sorted(later.glob("rank*")):
        for table in ("steps.csv", "collectives.csv"):
            rows = "".join((rank_dir / table).read_text().splitlines(keepends=True)[2:])
            with (damaged / rank_dir.name / table).open("a") as f:
                f.write(rows.replace("1795", "1796"))
    _wide_wait(damaged, 7)
    with (damaged / "rank00001" / "steps.csv").open("a") as f:
        f.write("41,not-a-number,5,6\ngarbage line\n")  # corrupt rows
    os.mkfifo(damaged / "rank00002" / "phases.csv")  # a table that is a FIFO: never read
    runs = [damaged, REPO / "sample_traces" / "pipeline", REPO / "sample_traces" / "hang"]
    with Workers(3) as workers:  # one pool, reused by the three loads
        for run in runs:
            old = load_without_collectives(run, analysed_columns_only=True, without=partitioned_module.RANK_TABLES)
            new = _load_in(workers, run)
            _same_trace(old, new)
    assert str(new.steps["data_wait_us"].dtype) == "int32"
    old = load_without_collectives(damaged, analysed_columns_only=True, without=partitioned_module.RANK_TABLES)
    assert str(old.steps["data_wait_us"].dtype) == "int64" and old.earlier_run_cuts_us
    reasons = [s.reason for s in old.skipped]
    assert any("corrupt rows" in r for r in reasons) and any("not a regular file" in r for r in reasons)


def test_worker_load_keeps_going_when_a_share_has_only_manifests(tmp_path):
    """Ranks that died before their first flush leave only manifest.json: a worker whose whole share is such
    ranks sends no steps, and the load is still the in-memory one; manifests alone load as no rows."""
    run = tmp_path / "run"
    make_trace(run, ranks=4, steps=12)
    for rank in range(4, 8):  # the second worker's share: manifests only
        (run / f"rank{rank:05d}").mkdir()
        shutil.copy(run / "rank00000" / "manifest.json", run / f"rank{rank:05d}" / "manifest.json")
    old = load_without_collectives(run, analysed_columns_only=True, without=partitioned_module.RANK_TABLES)
    with Workers(2) as workers:
        new = _load_in(workers, run)
        _same_trace(old, new)
    assert sorted(new.steps["rank"].unique()) == [0, 1, 2, 3]
    only_manifests = tmp_path / "only_manifests"
    for rank in range(8):
        (only_manifests / f"rank{rank:05d}").mkdir(parents=True)
        shutil.copy(run / "rank00000" / "manifest.json", only_manifests / f"rank{rank:05d}" / "manifest.json")
    with Workers(2) as workers:
        bare = _load_in(workers, only_manifests)
    assert bare.steps.empty and sorted(bare.manifests) == list(range(8))  # the command's "nothing usable" follows


def _load_in(workers: Workers, run: Path):
    """What analyze_partitioned loads, each worker reading its share of the ranks."""
    return load_without_collectives(run, analysed_columns_only=True, without=partitioned_module.RANK_TABLES,
                                    workers=workers)  # fmt: skip


def _corpus_cases() -> list[str]:
    from tests.reliability.corpus import build_cases

    return [name for name in build_cases() if "kineto" not in name]


@pytest.mark.slow
@pytest.mark.parametrize("name", _corpus_cases())
def test_corruption_corpus_same_report_or_same_error(name, tmp_path):
    """Every case of the reliability corpus (each class of damage applied to the real sample run): the two
    paths give the same report, or refuse the trace with the same error."""
    import warnings

    from tests.reliability.corpus import make_case

    case = make_case(name, tmp_path / "case")
    outcomes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for run in (in_memory, partitioned):
            try:
                outcomes.append(run(case))
            except TraceError as exc:
                outcomes.append(f"TraceError: {exc}")
    old, new = outcomes
    if isinstance(old, str) or isinstance(new, str):
        assert old == new
    else:
        assert differences(old, new) == []


def _planted_problems(report: dict, plants) -> list[str]:
    """What the report got wrong about the planted problems: the scale benchmarks' own check (stragglers
    with their causes, the transient one, the memory leak, the throttled GPU)."""
    return synthetic.check_planted(report, plants)


@pytest.mark.slow
def test_per_step_analyses_same_report_and_every_planted_problem_at_256_ranks_schema_2(tmp_path):
    """256 ranks in schema 2 (what capture writes at scale): memory and telemetry analysed rank by rank and
    the steps cut to the analysed columns give the in-memory report, every finding included (straggler,
    transient spike, memory leak, GPU throttling), and every planted problem is found."""
    plants = synthetic.generate(tmp_path, 256, 60, 4, trace_format=2)
    old, new = in_memory(tmp_path), partitioned(tmp_path)
    assert differences(old, new) == []
    assert [f["kind"] for f in new["findings"]] == [f["kind"] for f in old["findings"]]
    assert _planted_problems(new, plants) == []
    leak = next(r for r in new["memory"]["per_rank"] if r["rank"] == plants.leak)
    assert leak["leak_suspected"] and leak["growth_bytes_per_step"] > 0
    throttled = next(g for g in new["telemetry"]["per_gpu"] if g["rank"] == plants.throttled)
    assert throttled["throttled"] and len(new["telemetry"]["per_gpu"]) == 256


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_unreadable_partitions_at_scale_are_skipped_and_named(tmp_path, monkeypatch, processes):
    """A 96-rank schema-2 run (partitioned by default: over 64 ranks) with one rank's collectives segment and
    another's memory segment cut in half (a node that died mid-write) and a third's telemetry segment replaced by
    garbage: `diag analyze` reports on the rest, names each damaged file in run.skipped, and says what the
    in-memory path says."""
    plants = synthetic.generate(tmp_path, 96, 40, 4, trace_format=2)
    damaged = {
        tmp_path / "rank00005" / "collectives.000001.parquet": _truncate,
        tmp_path / "rank00017" / "memory.000001.parquet": _truncate,
        tmp_path / "rank00033" / "telemetry.000001.parquet": lambda p: p.write_bytes(b"PAR1 not parquet" * 64),
    }
    for path, damage in damaged.items():
        assert path.exists(), path
        damage(path)
    if processes:  # the passes in worker processes, as from PROCESS_MIN_RANKS ranks
        monkeypatch.setattr(processes_module, "PROCESS_MIN_RANKS", 1)
    result = run_cli(tmp_path, "--format", "json", "--no-cache")  # no flag: partitioned above 64 ranks
    assert result.exit_code == 0, result.output
    new = json.loads(result.stdout)
    named = {s["path"] for s in new["run"]["skipped"]}
    assert {str(p) for p in damaged} <= named, new["run"]["skipped"]
    assert differences(in_memory(tmp_path), new) == []
    assert len(new["telemetry"]["per_gpu"]) == 95  # every rank's GPU but the one whose telemetry is unreadable
    assert plants.compute_straggler in {s["rank"] for s in new["stragglers"]}


def test_a_rank_directory_missing_where_it_is_read_is_named(planted):
    """A rank's directory gone between the load and the reduction (on a cluster: a worker that does not see the
    trace directory) is named in run.skipped, not silently left out: inline and in worker processes."""
    path, _ = planted
    engines = {"inline": 1, "processes": 2}
    traces = {name: load_without_collectives(path) for name in engines}
    gone = path / "rank00003"
    hidden = path.parent / "hidden-rank00003"
    gone.rename(hidden)
    try:
        reports = {
            name: analyze(traces[name], reduce_collectives=collectives_reducer(traces[name], workers)).to_dict()
            for name, workers in engines.items()
        }
    finally:
        hidden.rename(gone)
    for report in reports.values():
        notes = [s for s in report["run"]["skipped"] if s["path"] == str(gone)]
        assert notes and "filesystem every Dask worker sees" in notes[0]["reason"]
        assert report["comms"]["per_rank"]  # the other ranks are analysed
    assert differences(reports["inline"], reports["processes"]) == []
