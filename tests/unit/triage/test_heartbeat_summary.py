"""``diag triage`` judges a rank that stalled or ended from its heartbeat's ``groups`` (each process group's
last collective issued and completed) without reading its tables (diag/triage/summary.py), and reads the
tables of every rank its heartbeat cannot decide. Here on synthetic hangs (diag.testing.synthetic --hang:
heartbeats as capture writes them); the real gloo jobs are in test_hangs.py
(test_verdict_from_heartbeats_equals_the_verdict_from_the_tables)."""

from __future__ import annotations

import json

from diag.trace.schema import SCHEMA_VERSION, rank_dir_name
from tests.analysis.helpers import synthetic
from tests.triage.helpers import edit_heartbeat, judged

RANKS, STEPS, PER_STEP = 12, 30, 5


def test_an_old_trace_without_heartbeat_groups_is_judged_from_its_tables(tmp_path):
    plants = synthetic.generate(
        tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True, heartbeat_groups=False
    )
    verdict, count = judged(tmp_path)
    assert count == 0
    assert verdict == judged(tmp_path, heartbeats=False)[0]
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [plants.hang_stuck]


def test_ranks_whose_heartbeat_may_lag_their_rows_are_read_from_their_tables(tmp_path):
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    edit_heartbeat(tmp_path, 1, lambda hb: hb.update(state="running"))  # rows flushed after the beat may be newer
    edit_heartbeat(tmp_path, 2, lambda hb: hb.update(time_us=hb["time_us"] - 60_000_000))  # stale, no exit record
    edit_heartbeat(tmp_path, 3, lambda hb: hb.update(pending_count=9))  # more pending than listed
    verdict, count = judged(tmp_path)
    assert count == RANKS - 3
    assert verdict == judged(tmp_path, heartbeats=False)[0]


def test_the_slow_rank_verdict_reads_the_steps_of_ranks_judged_from_heartbeats(tmp_path):
    """No hang left (each rank's stall cleared, then it ended by an exception with nothing pending): the slowest
    rank is named from every rank's steps, which the heartbeats do not carry: they are read when that verdict
    needs them."""
    plants = synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    for rank in range(RANKS):

        def ended(heartbeat):
            done = heartbeat["groups"]["0"]["completed"]
            heartbeat.update(state="exception", pending=[], exit={"how": "exception", "error": "ValueError: x"})
            heartbeat["groups"]["0"]["issued"] = done

        edit_heartbeat(tmp_path, rank, ended)
        dump = tmp_path / rank_dir_name(rank) / "hang_dump_001.json"
        dump.write_text(json.dumps({**json.loads(dump.read_text()), "pending": []}))  # the stall, since cleared
    from_heartbeats, count = judged(tmp_path)
    assert count == RANKS
    assert from_heartbeats == judged(tmp_path, heartbeats=False)[0]
    assert from_heartbeats["verdict"] == "slow"
    # by mean step time outside communication: the rank with five 0.5 s spikes in 30 steps
    assert from_heartbeats["culprit_ranks"] == [plants.transient]


def test_a_finished_rank_is_judged_from_its_tables(tmp_path):
    """A job that ended without a stall may owe its verdict to its whole history (a desync that completed):
    its ranks are read from their tables."""
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    for rank in range(RANKS):
        edit_heartbeat(tmp_path, rank, lambda hb: hb.update(state="finished", pending=[], exit={"how": "finished"}))
        (tmp_path / rank_dir_name(rank) / "hang_dump_001.json").unlink()
    verdict, count = judged(tmp_path)
    assert count == 0
    assert verdict == judged(tmp_path, heartbeats=False)[0]


def _add_group(path, rank: int, name: str, ranks: list[int]) -> None:
    manifest_path = path / rank_dir_name(rank) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.setdefault("process_groups", {})[name] = {"ranks": ranks, "size": len(ranks), "backend": "gloo"}
    manifest_path.write_text(json.dumps(manifest))


def test_ranks_in_a_group_no_heartbeat_reports_are_read_from_their_tables(tmp_path):
    """A heartbeat reports the groups of the collectives diag's wrapper issued; a group none reports (a device
    mesh's tp group: DTensor's collectives, read from Flight Recorder) may hold what a rank waits in, so its
    members are read from their tables. A group one member's heartbeat reports is the wrapper's: the others in
    it issued nothing there, and their heartbeats still decide them."""
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    for rank in (4, 5):
        _add_group(tmp_path, rank, "7", [4, 5])  # no heartbeat reports group 7
    for rank in (8, 9):
        _add_group(tmp_path, rank, "0", list(range(RANKS)))  # every heartbeat reports the world group
    verdict, count = judged(tmp_path)
    assert count == RANKS - 2
    assert verdict == judged(tmp_path, heartbeats=False)[0]
