"""``diag triage`` judges a rank that stalled or ended from its heartbeat's ``groups`` (each process group's
last collective issued and completed) without reading its tables (diag/triage/summary.py), and reads the
tables of every rank its heartbeat cannot decide. Here on synthetic hangs (diag.testing.synthetic --hang:
heartbeats as capture writes them); the real gloo jobs are in test_hangs.py
(test_verdict_from_heartbeats_equals_the_verdict_from_the_tables)."""

from __future__ import annotations

from diag.trace.schema import CSV_SCHEMA_VERSION, SCHEMA_VERSION
from tests.analysis.helpers import synthetic
from tests.triage.helpers import edit_heartbeat, judged

RANKS, STEPS, PER_STEP = 12, 30, 5


def test_every_rank_of_a_synthetic_hang_is_judged_from_its_heartbeat_with_the_tables_verdict(tmp_path):
    for trace_format in (CSV_SCHEMA_VERSION, SCHEMA_VERSION):
        path = tmp_path / str(trace_format)
        plants = synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=trace_format, hang=True)
        from_tables, none = judged(path, heartbeats=False)
        from_heartbeats, every = judged(path)
        assert (none, every) == (0, RANKS)
        assert from_heartbeats == from_tables
        assert from_heartbeats["verdict"] == "missing_ranks"
        assert from_heartbeats["culprit_ranks"] == [plants.hang_stuck]
        assert from_heartbeats["collective"]["seq"] == STEPS * PER_STEP + 1


def test_a_group_whose_heartbeats_disagree_is_read_from_the_tables(tmp_path):
    """Rank 4's heartbeat says it issued a different collective at the seq the others completed (a desync the
    rows show too): no rank of the group is judged from its heartbeat, and the verdict is the tables' one."""
    synthetic.generate(tmp_path, RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)

    def other_op(heartbeat):
        heartbeat["groups"]["0"]["completed"]["op"] = "all_gather"

    edit_heartbeat(tmp_path, 4, other_op)
    verdict, count = judged(tmp_path)
    assert count == 0
    assert verdict == judged(tmp_path, heartbeats=False)[0]

    synthetic.generate(tmp_path / "behind", RANKS, STEPS, PER_STEP, trace_format=SCHEMA_VERSION, hang=True)
    edit_heartbeat(tmp_path / "behind", 5, lambda hb: hb["groups"]["0"]["completed"].update(seq=3))
    assert judged(tmp_path / "behind")[1] == 0  # different last completed collectives: not a frozen hang
