"""diag compare over trace directories in the real format: synthetic runs with a planted straggler, the bundled
pipeline sample, real torch.profiler traces; the command's cache, errors and imports."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from diag.cli import main
from tests.analysis.helpers import REPO, make_trace, synthetic
from tests.compare.helpers import compare_json, row

RANKS, STEPS = 16, 60


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    make_trace(root / "base", RANKS, STEPS, plants=synthetic.Plants(), seed=0)
    make_trace(root / "again", RANKS, STEPS, plants=synthetic.Plants(), seed=1)
    make_trace(root / "straggler", RANKS, STEPS, plants=synthetic.Plants(compute_straggler=3), seed=2)
    make_trace(root / "half", RANKS // 2, STEPS, plants=synthetic.Plants(), seed=3)
    return root


def test_a_planted_straggler_is_a_regression_of_straggler_loss(synthetic_runs):
    data = compare_json(synthetic_runs / "base", synthetic_runs / "straggler", extra=("--no-cache",))
    assert data["verdict"] == "regression"
    top = data["attribution"][0]
    assert top["component"] == "straggler"
    # rank 3 computes 40% longer (100 ms steps): everyone waits for it, and analyze costs it the same
    finding = next(f for f in data["findings_added"] if f["kind"] == "straggler")
    assert finding["ranks"] == [3]
    assert top["delta_ms"] == pytest.approx(finding["time_lost_per_step_s"] * 1e3, rel=0.1)
    assert top["share_pct"] > 90
    assert data["config_differences"] == []
    # the mfu and throughput fell with the step time
    assert data["metrics"]["tokens_per_s"]["change_pct"] < -20 and data["metrics"]["mfu"]["change_pct"] < -20


def test_two_runs_of_one_synthetic_job_read_no_change(synthetic_runs):
    data = compare_json(synthetic_runs / "base", synthetic_runs / "again", extra=("--no-cache",))
    assert data["verdict"] == "no change"
    low, high = data["step_time"]["steady_ci_pct"]
    assert low <= 0 <= high or abs(data["step_time"]["steady_change_pct"]) < 2
    assert all(abs(a["delta_ms"]) < 2 for a in data["attribution"])  # of 107 ms steps
    assert data["findings_added"] == data["findings_removed"] == []


def test_interleaved_repeats_from_the_command_line(synthetic_runs):
    """BASE NEW BASE NEW --interleaved: one comparison of the pooled runs, its verdict from the pairs."""
    base, again, straggler = (str(synthetic_runs / n) for n in ("base", "again", "straggler"))
    data = compare_json(base, straggler, again, straggler, extra=("--interleaved", "--no-cache"))
    assert data["verdict"] == "regression" and len(data["comparisons"]) == 1 and len(data["runs"]) == 4
    repeats = data["step_time"]["repeats"]
    assert repeats["pairs"] == 2 and repeats["ci_pct"][0] > 0 and len(repeats["changes_pct"]) == 2
    assert data["attribution"][0]["component"] == "straggler"
    result = CliRunner().invoke(main, ["compare", base, straggler, again, "--interleaved", "--no-cache"])
    assert result.exit_code == 2 and "pairs of runs" in result.output


def test_a_run_against_itself_changes_nothing(synthetic_runs):
    data = compare_json(synthetic_runs / "base", synthetic_runs / "base", extra=("--no-cache",))
    assert data["verdict"] == "no change"
    low, high = data["step_time"]["ci_pct"]
    assert data["step_time"]["change_pct"] == 0 and -1 < low < 0 < high < 1  # each run resampled on its own
    assert all(a["delta_ms"] == 0 for a in data["attribution"])


def test_half_the_ranks_gives_scaling_and_the_world_size_difference_first(synthetic_runs):
    data = compare_json(synthetic_runs / "half", synthetic_runs / "base", extra=("--no-cache",))
    assert data["config_differences"][0]["key"] == "world_size"
    assert (data["config_differences"][0]["base"], data["config_differences"][0]["new"]) == (8, 16)
    scaling = data["scaling"]
    assert scaling["baseline"] == "half" and scaling["unit"] == "tokens"
    # the synthetic generator gives every rank the same tokens: the global batch doubles with the ranks
    assert scaling["kind"] == "weak"
    sixteen = scaling["runs"][1]
    assert 90 < sixteen["efficiency_pct"] <= 101


def test_the_pipeline_sample_against_itself_has_a_bubble_and_no_change():
    data = compare_json(REPO / "sample_traces" / "pipeline", REPO / "sample_traces" / "pipeline", extra=("--no-cache",))
    assert data["verdict"] == "no change"
    bubble = row(data, "bubble")
    assert bubble["base_ms"] > 0 and bubble["delta_ms"] == 0


def test_torch_profiler_traces_are_split_into_gpu_time(hta_fixtures):
    path = hta_fixtures / "nccl_parser_config"
    data = compare_json(path, path)
    keys = {a["component"] for a in data["attribution"]}
    assert {"gpu_compute", "gpu_idle", "gpu_memory", "outside_gpu"} <= keys
    assert any(k.startswith("exposed_comm:all_reduce") for k in keys)
    gpu = sum(a["base_ms"] for a in data["attribution"] if a["component"] != "unattributed")
    assert gpu == pytest.approx(data["runs"][0]["step_s"] * 1e3, rel=0.05)  # the parts add up to the step
    assert data["verdict"] == "no change"


def test_the_summaries_are_cached_next_to_the_traces(synthetic_runs, tmp_path):
    import shutil

    base, new = tmp_path / "base", tmp_path / "straggler"
    shutil.copytree(synthetic_runs / "base", base)
    shutil.copytree(synthetic_runs / "straggler", new)
    first = compare_json(base, new)
    entries = [p.name for p in (base / ".diag-cache").rglob("*") if p.name.startswith(("compare-", "report-"))]
    assert any(n.startswith("compare-") for n in entries) and any(n.startswith("report-") for n in entries)
    assert compare_json(base, new) == first
    # diag analyze reads the report compare cached
    result = CliRunner().invoke(main, ["analyze", str(base), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0 and "report read from the cache" in result.stderr


def test_errors_a_user_can_act_on(tmp_path, synthetic_runs):
    one = CliRunner().invoke(main, ["compare", str(synthetic_runs / "base")])
    assert one.exit_code == 2 and "at least two runs" in one.output
    missing = CliRunner().invoke(main, ["compare", str(synthetic_runs / "base"), str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(main, ["compare", str(synthetic_runs / "base"), str(tmp_path / "empty"), "--no-cache"])
    assert empty.exit_code == 2 and "empty" in empty.output
    steps = CliRunner().invoke(
        main, ["compare", str(synthetic_runs / "base"), str(synthetic_runs / "base"), "--steps", "x"]
    )
    assert steps.exit_code == 2 and "--steps" in steps.output
    # a window with no step of a run: exit 2 saying so, as diag analyze (before: exit 0, "no verdict")
    past = CliRunner().invoke(
        main, ["compare", str(synthetic_runs / "base"), str(synthetic_runs / "again"), "--steps", "100:200"]
    )
    assert past.exit_code == 2 and "no complete step in --steps 100:200" in past.output


def test_steps_option_compares_the_same_window_of_every_run(synthetic_runs):
    data = compare_json(synthetic_runs / "base", synthetic_runs / "straggler", extra=("--no-cache", "--steps", "10:30"))
    assert [r["steps_analysed"] for r in data["runs"]] == [20, 20]
    help_text = CliRunner().invoke(main, ["compare", "--help"]).output
    assert "Examples:" in help_text and "diag compare traces/before traces/after" in help_text
    json.dumps(data, allow_nan=False)
