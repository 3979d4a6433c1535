"""Real 4-rank gloo jobs that fail in ways triage once called wrong, judged by ``diag triage`` as a user would,
with what it says to do next (the jobs are the fault-injection suite's: diag/testing/fault_job.py)."""

import json
from pathlib import Path

import pytest

from diag.testing import faults
from tests.conftest import REPO
from tests.triage.jobs import diag_triage_json

pytestmark = pytest.mark.slow
SAMPLE_RUN = REPO / "sample_traces" / "straggler"


# the earlier suite's fault names as the scenario generator's (kind, where, desync variant)
KINDS = {
    "late": ("frozen", "forward", ""),
    "frozen": ("frozen", "forward", ""),
    "desync_shape": ("desync", "collective", "shape"),
    "inside": ("hang", "collective", ""),
    "cross_group": ("cross_group", "collective", ""),
    "preempted": ("preempted", faults.NO_WHERE, ""),
}


def _run(tmp_path: Path, fault: str, rank: int = 3, step: int = 3, shape: str = "propagate") -> dict:
    kind, where, variant = KINDS[fault]
    scenario = faults.Scenario(shape, "sleep", 4, kind, where, "none", rank=rank, step=step, variant=variant)
    faults.run_case(scenario, tmp_path)
    verdict = diag_triage_json(tmp_path / "trace")
    # what to do next, on each fault kind here as in the fault suite (frozen, cross_group and preempted are
    # not in its fixed sample)
    assert verdict["action"] == scenario.expected_action, (verdict["action"], verdict["action_why"])
    assert isinstance(verdict["hosts"], list) and isinstance(verdict["gpus"], list)
    return verdict


def test_rank_arriving_after_the_others_timed_out_is_missing_not_slow(tmp_path):
    verdict = _run(tmp_path, "late")
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [3]
    assert verdict["collective"]["op"] == "all_reduce"
    evidence = "\n".join(verdict["evidence"])
    assert "entered only after that" in evidence and "Timed out" in evidence, evidence
    late = verdict["ranks"]["3"]
    assert late["state"] == "stuck_in_compute" and late["last_phase"] == "forward"  # where it was, from its stall
    # capture recorded each collective that raised, with its error and when it was entered and raised
    errors = [
        json.loads(line)
        for path in (tmp_path / "trace").glob("rank*/events.jsonl")
        for line in path.read_text().splitlines()
        if '"collective_error"' in line
    ]
    assert {e["rank"] for e in errors} == {0, 1, 2, 3}
    assert all(e["op"] == "all_reduce" and e["error"] and e["time_us"] >= e["start_us"] for e in errors)
    late_entry = next(e["start_us"] for e in errors if e["rank"] == 3)
    assert late_entry > max(e["time_us"] for e in errors if e["rank"] != 3)  # it entered after they gave up
    for rank in ("0", "1", "2", "3"):  # every rank raised: none "finished normally"
        assert "finished normally" not in verdict["ranks"][rank]["detail"]
        assert "exited with RuntimeError" in verdict["ranks"][rank]["detail"]


def test_frozen_rank_continued_after_the_timeout_is_missing(tmp_path):
    verdict = _run(tmp_path, "frozen", rank=1)
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [1]
    assert any("entered only after that" in line for line in verdict["evidence"])


def test_shape_mismatch_with_equal_bytes_is_a_desync(tmp_path):
    verdict = _run(tmp_path, "desync_shape", rank=2)
    assert verdict["verdict"] == "desync" and verdict["culprit_ranks"] == [2]
    evidence = "\n".join(verdict["evidence"])
    assert "shapes 4x3 -> 4x3" in evidence and "shapes 12 -> 12" in evidence  # the others pass what they always do
    assert "(48 B, float32" in evidence  # equal bytes: only the shapes tell


def test_every_rank_inside_a_collective_none_completed_is_a_collective_hang(tmp_path):
    """Rank 1 entered the all_reduce first and was frozen inside it; the others entered 2 s
    later and timed out. Nobody is missing: the verdict names the collective and its group, says so, and gives
    each rank's entry time and the transport."""
    verdict = _run(tmp_path, "inside", rank=1)
    assert verdict["verdict"] == "collective_hang", verdict["evidence"]
    assert verdict["culprit_ranks"] == []
    assert verdict["collective"]["op"] == "all_reduce"
    evidence = "\n".join(verdict["evidence"])
    assert "no rank is missing" in evidence
    assert all(f"rank {rank} entered at" in evidence for rank in range(4))
    assert "transport: backend gloo" in evidence


@pytest.mark.parametrize("bad_rank", [0, 2])
def test_cross_group_deadlock_names_both_ranks(tmp_path, bad_rank):
    """With ranks 2 and 3 the first pending collective found is a side group's barrier that only one of them
    is missing from: the culprits are still both ranks on the cycle (the fault suite called [2] or [3]). Each
    rank on the cycle also holds, in its Flight Recorder dump, the DDP bucket of the step it finished last,
    which gloo never marks completed: it returned (the step ended), and must not read as where the rank waits."""
    verdict = _run(tmp_path, "cross_group", rank=bad_rank)
    assert verdict["verdict"] == "deadlock" and verdict["culprit_ranks"] == [bad_rank, bad_rank + 1]
    assert any("wait for each other across process groups" in line for line in verdict["evidence"])


def test_healthy_job_preempted_by_sigterm_is_not_a_hang(tmp_path):
    verdict = _run(tmp_path, "preempted", rank=1)
    assert verdict["verdict"] == "no_problem" and verdict["culprit_ranks"] == []
    assert {r["state"] for r in verdict["ranks"].values()} == {"terminated"}
    assert any("stopped from outside" in line for line in verdict["evidence"])


def test_bundled_healthy_run_is_no_problem():
    """gloo DDP buckets read from Flight Recorder carry no completion: they must not look pending."""
    verdict = diag_triage_json(SAMPLE_RUN)
    assert verdict["verdict"] == "no_problem" and verdict["culprit_ranks"] == []
    assert {r["state"] for r in verdict["ranks"].values()} == {"finished"}
