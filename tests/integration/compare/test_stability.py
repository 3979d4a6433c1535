"""Training stability in diag compare (issue 18): real 2-rank gloo DDP runs of tests/analysis/health_job.py,
which record loss and gradient norm with diag.record: a healthy run against the same job with rank 1's batch
scaled 30x at step 17 (a loss spike), and against one with a NaN in rank 1's batch at step 17 (NaN from then
on: the all-reduce spreads it to every replica)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.launch import run_ranks
from tests.compare.helpers import compare_json

JOB = Path(__file__).resolve().parents[2] / "analysis" / "health_job.py"
WORLD, STEPS, PLANT_RANK, PLANT_STEP = 2, 30, 1, 17


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stability")
    for plant in ("none", "spike", "nan"):
        argv = [str(JOB), str(root / plant), str(STEPS), plant, str(PLANT_RANK), str(PLANT_STEP)]
        for result in run_ranks(argv, WORLD, timeout_s=300):
            assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.mark.slow
def test_a_loss_spike_and_a_nan_are_set_against_the_healthy_run(runs):
    data = compare_json(runs / "none", runs / "spike", runs / "nan", extra=("--no-cache",))
    spike, nan = (c["stability"] for c in data["comparisons"])
    assert data["stability"] == spike  # the top level is BASE against NEW
    # same seeds, same batches until the plant: the losses agree step for step before it
    assert spike["matched_steps"] == STEPS
    assert spike["loss_diff_max_step"] == PLANT_STEP and spike["loss_diff_max_abs"] > 1.0
    # the planted step, then (with two ranks) the step after it on both: the all-reduced gradient of the
    # scaled batch throws both replicas off once
    assert spike["base"]["loss_spikes"] == 0 and spike["new"]["spike_steps"] in ([PLANT_STEP], [PLANT_STEP, 18])
    assert spike["base"]["nonfinite_steps"] == spike["new"]["nonfinite_steps"] == 0
    assert spike["base"]["mean_loss"] < spike["new"]["mean_loss"]
    assert any(c.startswith(f"loss spikes: 0 -> {spike['new']['loss_spikes']}") for c in spike["changes"])
    # NaN from the plant on (rank 0's loss at the planted step is still finite: that step's loss is its own)
    assert nan["new"]["nonfinite_steps"] == STEPS - PLANT_STEP
    assert nan["matched_steps"] == PLANT_STEP + 1 and nan["new"]["last_step"] == PLANT_STEP
    first = nan["new"]["first_nonfinite"]
    assert (first["step"], first["rank"], first["value_name"]) == (PLANT_STEP, PLANT_RANK, "loss")
    assert nan["loss_diff_max_abs"] < 0.01 * nan["base"]["mean_loss"]  # identical before the NaN
    assert nan["changes"][0].startswith(f"non-finite values appeared: {STEPS - PLANT_STEP} steps")
    json.dumps(data, allow_nan=False)


@pytest.mark.slow
def test_stability_in_text_markdown_and_html(runs, tmp_path):
    args = ["compare", str(runs / "none"), str(runs / "spike"), "--no-cache", "--fail-on", "never"]
    text = CliRunner().invoke(main, args).stdout
    assert "Training stability" in text and "loss spikes: 0 -> " in text and "steps with NaN/inf" in text
    markdown = CliRunner().invoke(main, [*args, "--format", "markdown"]).stdout
    assert "## Training stability" in markdown and "| loss spikes | 0 | " in markdown
    page = tmp_path / "c.html"
    assert CliRunner().invoke(main, [*args, "--format", "html", "-o", str(page)]).exit_code == 0
    html = page.read_text()
    assert "Training stability" in html and "Loss per step (median over ranks)" in html
    # the figure holds both runs' curves: each run's losses, as its JSON gives them
    data = compare_json(runs / "none", runs / "spike", extra=("--no-cache",))
    for run in data["runs"]:
        assert len(run["loss_steps"]) == STEPS and json.dumps(run["loss"][PLANT_STEP])[:8] in html
