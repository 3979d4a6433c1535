"""``diag triage`` reads a trace's ranks as one two-stage analysis (``sources.TailRead``) on the engine's runner:
inline, or in worker processes for a large trace. Every executor and every batching of the ranks reads the same
rows, in rank order, so the verdict is the same. Here the workers are asked for on small synthetic hangs
(diag.testing.synthetic --hang, real trace files) that one process would otherwise read; the real gloo jobs are
compared in test_hangs.py (test_worker_processes_read_the_same_as_one_process)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.analysis import engine
from diag.trace.schema import CSV_SCHEMA_VERSION, SCHEMA_VERSION, rank_dir_name
from diag.triage.sources import read_diag_trace
from tests.analysis.helpers import synthetic
from tests.triage.helpers import assert_same_read, same_read

RANKS, STEPS, PER_STEP = 12, 30, 5


def edit_heartbeat(path, rank: int, edit) -> None:
    file = path / rank_dir_name(rank) / "heartbeat.json"
    heartbeat = json.loads(file.read_text())
    edit(heartbeat)
    file.write_text(json.dumps(heartbeat))


@pytest.mark.parametrize("trace_format", [CSV_SCHEMA_VERSION, SCHEMA_VERSION], ids=["csv", "v2"])
def test_an_old_trace_read_by_workers_equals_one_process(tmp_path, trace_format):
    plants = synthetic.generate(
        tmp_path, RANKS, STEPS, PER_STEP, trace_format=trace_format, hang=True, heartbeat_groups=False
    )
    for workers in (2, 3):
        verdict = assert_same_read(tmp_path, workers)
        assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [plants.hang_stuck]
    assert_same_read(tmp_path, 2, rows_per_rank=7)  # tails cut: the note on what was not read is the same too


def test_ranks_read_in_the_second_round_come_back_in_rank_order(tmp_path):
    """Ranks whose heartbeat could decide them but, judged over every rank's heartbeat, does not (here: rank 1's
    beat is not a stall, rank 6's is stale) are read after the others: their rows still take their rank's place."""
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    edit_heartbeat(tmp_path, 1, lambda hb: hb.update(state="running"))
    edit_heartbeat(tmp_path, 6, lambda hb: hb.update(time_us=hb["time_us"] - 60_000_000))
    edit_heartbeat(tmp_path, 9, lambda hb: hb.pop("groups"))  # an old rank's beat: read in the first round
    assert_same_read(tmp_path, 2)
    data = read_diag_trace(tmp_path, workers=2)
    assert sorted(r for r, i in data.ranks.items() if not i.judged_by_heartbeat) == [1, 6, 9]
    assert data.steps["rank"].is_monotonic_increasing  # rows as read (ops gain the heartbeats' and dumps' rows)
    assert_same_read(tmp_path, 2, heartbeats=False)  # every rank in the first round


def test_a_damaged_partition_read_by_a_worker_is_skipped_and_named(tmp_path):
    plants = synthetic.generate(
        tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True, heartbeat_groups=False
    )
    damaged = tmp_path / rank_dir_name(3) / "collectives.000001.parquet"
    damaged.write_bytes(damaged.read_bytes()[:200])  # truncated: its footer gone
    (tmp_path / rank_dir_name(8) / "steps.000001.parquet").write_bytes(b"PAR1 not a parquet file")
    verdict = assert_same_read(tmp_path, 2)
    skipped = "\n".join(verdict["skipped"])
    assert f"{damaged}: unreadable Parquet segment" in skipped
    assert f"{rank_dir_name(8)}/steps.000001.parquet: unreadable Parquet segment" in skipped
    assert verdict["verdict"] == "missing_ranks" and plants.hang_stuck in verdict["culprit_ranks"]


def test_a_worker_that_fails_is_said_at_once(tmp_path, monkeypatch):
    """A bug in a worker (planted here: the forked worker inherits the patched read of a side file) ends the read
    with its traceback, and the other worker, waiting to be told which ranks to read next, is stopped at once."""
    from diag.triage import sources

    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    side = sources._read_rank_side

    def failing(reader, rank, rank_dir):
        if rank == RANKS - 1:
            raise ValueError("planted")
        return side(reader, rank, rank_dir)

    monkeypatch.setattr(sources, "_read_rank_side", failing)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="ValueError: planted"):
        read_diag_trace(tmp_path, workers=2)
    assert time.monotonic() - start < 10  # not the 30 s a join would wait for a worker left waiting


# each rank's heartbeat as the property tests leave it: as written (a stall, judged from it), not a stall (its
# tables read in stage 2), stale (likewise), or an old rank's without groups (its tables read in stage 1)
HEARTBEAT_EDITS = {
    "as written": lambda hb: None,
    "running": lambda hb: hb.update(state="running"),
    "stale": lambda hb: hb.update(time_us=hb["time_us"] - 60_000_000),
    "no groups": lambda hb: hb.pop("groups"),
}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edits=st.lists(st.sampled_from(sorted(HEARTBEAT_EDITS)), min_size=RANKS, max_size=RANKS),
    workers=st.integers(2, 4),
)
def test_any_mix_of_heartbeats_reads_the_same_inline_and_in_workers(tmp_path_factory, edits, workers):
    """Whichever ranks each stage reads, inline and ``workers`` processes give the same read and verdict."""
    path = tmp_path_factory.mktemp("mixed")
    synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    for rank, edit in enumerate(edits):
        edit_heartbeat(path, rank, HEARTBEAT_EDITS[edit])
    assert_same_read(path, workers)
    steps = read_diag_trace(path, workers=workers).steps
    assert steps is None or steps["rank"].is_monotonic_increasing  # each stage's rows in their ranks' places


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A hang whose ranks 1 and 6 are read in stage 2 and rank 9 in stage 1, the others judged from heartbeats."""
    path = tmp_path_factory.mktemp("mixed")
    synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    edit_heartbeat(path, 1, HEARTBEAT_EDITS["running"])
    edit_heartbeat(path, 6, HEARTBEAT_EDITS["stale"])
    edit_heartbeat(path, 9, HEARTBEAT_EDITS["no groups"])
    return path, read_diag_trace(path, workers=1)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, RANKS + 1), held=st.sampled_from([0, 1000, 1 << 30]), heartbeats=st.booleans())
def test_any_batching_and_held_budget_read_the_same(mixed, batch, held, heartbeats):
    """Inline, any number of ranks a batch and any budget for the listings held between the stages (beyond it a
    rank's side files are read again) give the same read."""
    path, _ = mixed
    expected = read_diag_trace(path, workers=1, heartbeats=heartbeats)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "BATCH_RANKS", batch)
        patch.setattr(engine, "HELD_BYTES_MAX", held)
        same_read(read_diag_trace(path, workers=1, heartbeats=heartbeats), expected)
