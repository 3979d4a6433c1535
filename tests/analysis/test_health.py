"""Training health: real DDP jobs (gloo, 3 ranks) that record their loss and gradient norm, each with one
planted fault, are named at the right rank and step; a healthy one has no health finding; and the rules on
numbers made to test them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag.analysis.health import _clusters, analyze_health
from diag.launch import run_ranks
from diag.trace.manifest import Manifest
from tests.analysis.helpers import cli_json

JOB = Path(__file__).with_name("health_job.py")
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


def steps_frame(values: dict[int, list[float]], name: str = "loss") -> pd.DataFrame:
    rows = [
        {"rank": r, "step": s, "loss": np.nan, "grad_norm": np.nan, "param_fingerprint": np.nan, name: v}
        for r, series in values.items()
        for s, v in enumerate(series)
    ]
    return pd.DataFrame(rows)


def test_a_noisy_but_steady_loss_has_no_spike_and_a_jump_has_one():
    rng = np.random.default_rng(0)
    noisy = list(2.0 + 0.05 * rng.standard_normal(60))
    assert analyze_health(steps_frame({0: noisy}), pd.DataFrame(), {}).spikes == []
    noisy[40] = 4.0
    (spike,) = analyze_health(steps_frame({0: noisy}), pd.DataFrame(), {}).spikes
    assert (spike.step, spike.ranks) == (40, [0])


def test_a_rank_whose_gradient_norm_departs_from_its_peers_is_named():
    equal = [1.0 + 0.1 * i for i in range(20)]
    frame = steps_frame({0: equal, 1: equal, 2: [v * 1.5 for v in equal], 3: equal}, "grad_norm")
    (departure,) = analyze_health(frame, pd.DataFrame(), {}).departures
    assert (departure.rank, departure.value_name) == (2, "grad_norm")


def test_fingerprints_are_compared_within_each_replica_group_only():
    frame = steps_frame({0: [1.0] * 5, 1: [1.0] * 5, 2: [7.0] * 5, 3: [7.0] * 5}, "param_fingerprint")
    groups = {0: "a", 1: "a", 2: "b", 3: "b"}  # two tensor-parallel shards, each replicated twice
    manifests = {r: Manifest(r, replica_group=g) for r, g in groups.items()}
    report = analyze_health(frame, pd.DataFrame(), manifests)
    assert report.divergence is None and report.fingerprint_steps == 10
    assert _clusters({0: 1.0, 1: 1.0 + 1e-12, 2: 1.5}) == [[0, 1], [2]]
