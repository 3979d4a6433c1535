"""Training health: real DDP jobs (gloo, 3 ranks) that record their loss and gradient norm, each with one
planted fault, are named at the right rank and step; a healthy one has no health finding; and the rules on
numbers made to test them."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.launch import run_ranks
from tests.analysis.helpers import cli_json

JOB = Path(__file__).resolve().parents[2] / "analysis" / "health_job.py"
WORLD, STEPS, PLANT_RANK, PLANT_STEP = 3, 30, 1, 17
HEALTH_KINDS = ("nonfinite", "replica_divergence", "loss_spike", "rank_departs")


def run_job(trace_dir: Path, plant: str) -> dict:
    argv = [str(JOB), str(trace_dir), str(STEPS), plant, str(PLANT_RANK), str(PLANT_STEP)]
    for result in run_ranks(argv, WORLD, timeout_s=300):
        assert result.returncode == 0, result.stderr[-3000:]
    return cli_json(trace_dir)


def health_findings(report: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in report["findings"] if f["kind"] in HEALTH_KINDS}


@pytest.mark.slow
def test_a_healthy_run_has_no_health_finding_and_identical_replicas(tmp_path):
    report = run_job(tmp_path, "none")
    health = report["health"]
    assert health["recorded"] and health["divergence"] is None and health["fingerprint_steps"] == STEPS
    assert health_findings(report) == {}
    losses = [s["loss_median"] for s in health["per_step"]]
    assert len(losses) == STEPS and losses[-1] < losses[0]  # it trains


@pytest.mark.slow
def test_a_nan_on_one_rank_is_named_at_its_step_not_where_the_all_reduce_spread_it(tmp_path):
    report = run_job(tmp_path, "nan")
    first = report["health"]["first_nonfinite"][0]
    assert (first["rank"], first["step"], first["value_name"]) == (PLANT_RANK, PLANT_STEP, "loss")
    finding = health_findings(report)["nonfinite"]
    assert finding["severity"] == "high" and f"rank {PLANT_RANK} at step {PLANT_STEP}" in finding["title"]


@pytest.mark.slow
def test_a_loss_spike_on_one_rank_is_named(tmp_path):
    report = run_job(tmp_path, "spike")
    spikes = report["health"]["spikes"]
    assert [(s["step"], s["ranks"]) for s in spikes] == [(PLANT_STEP, [PLANT_RANK])]
    assert health_findings(report)["loss_spike"]["ranks"] == [PLANT_RANK]


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["desync", "skip_allreduce"])
def test_a_replica_that_drifts_is_named_at_the_step_it_drifted(tmp_path, plant):
    report = run_job(tmp_path, plant)
    divergence = report["health"]["divergence"]
    assert divergence["step"] == PLANT_STEP and divergence["ranks"] == [PLANT_RANK]
    assert sorted(divergence["majority"]) == sorted(set(range(WORLD)) - {PLANT_RANK})
    finding = health_findings(report)["replica_divergence"]
    assert finding["severity"] == "high" and finding["ranks"] == [PLANT_RANK]
