"""A hang in one sub-mesh of a real dp=2 x tp=2 gloo job (tests/jobs/mesh_job.py; the job itself runs in
tests/integration/analysis/test_device_mesh.py): rank 3 stopped before a tensor-parallel all_reduce. Judged from
diag's trace and from the ranks' Flight Recorder dumps alone, triage names the tp group it stalls first."""

from pathlib import Path

from diag.triage.analysis import triage
from diag.triage.flight_recorder import normalise_dump
from diag.triage.sources import read_input

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MESH_LINE = (
    "process group 4 is the tp group of ranks 2, 3 in the device mesh (dp=2 x tp=2): rank 3 stalls that tp group "
    "first (rank 3 at dp=1, tp=1)"
)


def _check(verdict) -> None:
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [3], verdict.evidence
    assert verdict.collective["pg"] == "4"
    assert MESH_LINE in verdict.evidence, verdict.evidence
    # the dp groups wait for the rank missing from each, not for every rank whose dump mentions a group "1" or "2"
    assert "also pending: rank 1 at seq 17 of process group 2 (a dp group), waiting for rank 3" in verdict.evidence
    assert "also pending: rank 0 at seq 17 of process group 1 (a dp group), waiting for rank 2" in verdict.evidence


def test_from_diags_trace():
    _check(triage(read_input(FIXTURES / "triage" / "mesh_tp_hang")))


def test_from_gloo_flight_recorder_dumps_alone():
    _check(triage(read_input(FIXTURES / "flight_recorder" / "gloo_mesh_tp_hang_1")))


def test_gloo_pg_status_keyed_by_each_ranks_own_group_ids_is_read_by_group_name():
    entry = {"record_id": 0, "collective_seq_id": 16, "profiling_name": "gloo:all_reduce", "state": "scheduled"}
    raw = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
        # rank 3 of the mesh: its dp group "2" is its id 1, its tp group "4" its id 2; "1" is another rank's group
        "pg_status": {"1": {"last_completed_collective": 16}, "2": {"last_completed_collective": 8}},
        "entries": [
            {**entry, "pg_id": 1, "process_group": ("2", "mesh_dp")},
            {**entry, "record_id": 1, "pg_id": 2, "collective_seq_id": 8, "process_group": ("4", "mesh_tp")},
        ],
    }
    dump = normalise_dump(raw, "fr_rank_3", 3)
    assert dump.last_completed_seq == {"2": 16, "4": 8}
    assert all(e.completed for e in dump.entries)


def test_a_rank_late_into_its_tp_group_is_the_culprit_not_its_peer_that_gave_up():
    """The fault suite's mesh shape (diag/testing/fault_job.py, FAULT_SHAPE=mesh): rank 0 computed 10 s in its
    optimizer step; its tp peer, rank 1, timed out in the next forward's tensor-parallel all_reduce (a functional
    collective: only Flight Recorder has it, and gloo counts it completed) and never reached the world all_reduce
    ranks 2 and 3 waited in. Rank 0 entered that tp collective 4 s after rank 1 gave up: rank 1 waited for it."""
    verdict = triage(read_input(FIXTURES / "triage" / "mesh_late_rank"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [0], verdict.evidence
    assert (
        "rank 1 gave up waiting in all_reduce at seq 10 of process group 3, which rank 0 entered only after that"
        in verdict.evidence
    )
    assert any(line.startswith("process group 3 is the tp group of ranks 0, 1") for line in verdict.evidence)
    assert verdict.ranks[1].state == "stuck_in_collective"  # in DTensor's wait, not in its own compute


def test_mesh_hang_names_the_tp_group_the_rank_would_reach_first_though_dp_waiters_entered_sooner():
    """8 ranks, dp=4 x tp=2 (tests/jobs/mesh_job.py hang 5): rank 5 stops in a step's forward. Its tp peer
    (rank 4) waits in the forward's tensor-parallel all_reduce; on a loaded host ranks 1, 3 and 7 ran their
    forward and backward with their own tp peers and entered the dp gradient all_reduce 2 ms before rank 4
    entered its. Rank 5 issues its tp collective before its dp one each step, so the tp group is the one it
    holds up first, whichever group's waiters got there sooner."""
    verdict = triage(read_input(FIXTURES / "triage" / "mesh_8_ranks_dp_waiters_entered_first"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [5], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("5", 9)
    assert any("rank 5 stalls that tp group first" in line for line in verdict.evidence), verdict.evidence
