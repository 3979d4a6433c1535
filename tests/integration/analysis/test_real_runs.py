"""Real 3-rank CPU jobs (gloo, DDP, captured by diag) with a straggler planted at a known rank: the report must
name that rank and the right cause; a balanced job must get no straggler finding. The job is the one that
makes the bundled sample (sample_traces/make_samples.py)."""

from __future__ import annotations

import pytest

from diag.analysis.window import WARMUP_MAX_FRACTION
from diag.launch import run_ranks
from tests.analysis.helpers import REPO, cli_json, findings_of, run_cli
from tests.conftest import requires_gpu

pytestmark = pytest.mark.slow

JOB = REPO / "sample_traces" / "make_samples.py"
WORLD = 3
STEPS = 30
EXTRA_MS = 40


def run_job(tmp_path_factory, mode: str, slow_rank: int, env: dict | None = None):
    trace_dir = tmp_path_factory.mktemp(f"real-{mode}")
    results = run_ranks(
        [str(JOB), "job", str(trace_dir), str(STEPS), str(slow_rank), mode, str(EXTRA_MS)],
        WORLD,
        env=env,
        timeout_s=240,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return cli_json(trace_dir)


@pytest.fixture(scope="module")
def compute_straggler_report(tmp_path_factory):
    return run_job(tmp_path_factory, "compute", slow_rank=1)


@pytest.fixture(scope="module")
def data_straggler_report(tmp_path_factory):
    return run_job(tmp_path_factory, "data", slow_rank=2)


@pytest.fixture(scope="module")
def balanced_report(tmp_path_factory):
    return run_job(tmp_path_factory, "none", slow_rank=0)


def test_straggler_named_when_one_rank_computes_more(compute_straggler_report):
    report = compute_straggler_report
    top = report["findings"][0]
    assert (top["kind"], top["ranks"]) == ("straggler", [1])
    straggler = report["stragglers"][0]
    assert (straggler["rank"], straggler["cause"], straggler["persistent"]) == (1, "compute", True)
    # it arrives last at the gradient all-reduces: the others wait for it
    assert straggler["last_arrival_fraction"] > 0.5
    # the planted 40 ms of extra compute is what the others wait for, give or take scheduling noise: its median
    # step; the mean cost also holds whatever else that rank made the others wait for (on a loaded box once a
    # 475 ms stall of it in one step of 27: 52.9 ms/step for a 39.4 ms median)
    assert 0.6 * EXTRA_MS < straggler["excess_compute_ms"] < 1.3 * EXTRA_MS
    assert top["time_lost_per_step_s"] > 0.6 * EXTRA_MS / 1e3


def test_straggler_named_when_data_loader_is_slow(data_straggler_report):
    report = data_straggler_report
    persistent = [s for s in report["stragglers"] if s["persistent"]]
    assert [(s["rank"], s["cause"]) for s in persistent] == [(2, "data")]
    assert findings_of(report, "straggler")[0]["ranks"] == [2]
    assert persistent[0]["excess_data_wait_ms"] == pytest.approx(EXTRA_MS, rel=0.3)


def test_balanced_job_gets_no_straggler_finding(balanced_report):
    assert not findings_of(balanced_report, "straggler")
    assert not [s for s in balanced_report["stragglers"] if s["persistent"]]
    # the leading steps left out as warm-up: on a busy box more of them run 1.5x slow, never over the bound
    assert balanced_report["run"]["window"]["steps_analysed"] >= STEPS - int(STEPS * WARMUP_MAX_FRACTION)


def test_default_command_analyses_the_bundled_sample_run():
    result = run_cli()
    assert result.exit_code == 0, result.output
    assert "bundled sample run" in result.stderr
    assert "Rank 1 is a persistent straggler (compute)" in result.stdout


@requires_gpu
@pytest.mark.gpu
def test_gpu_compute_straggler_named_with_telemetry_memory_and_peak(tmp_path_factory):
    """The same job with every rank on the one GPU (gloo moves the gradients): the straggler is found from
    real CUDA timings, and the GPU sections are filled from NVML and the caching allocator."""
    report = run_job(tmp_path_factory, "compute", slow_rank=1, env={"DIAG_JOB_DEVICE": "cuda"})
    persistent = [(s["rank"], s["cause"]) for s in report["stragglers"] if s["persistent"]]
    assert persistent == [(1, "compute")]
    assert sorted(g["rank"] for g in report["telemetry"]["per_gpu"]) == list(range(WORLD))
    gpu = report["telemetry"]["per_gpu"][0]
    assert 0 < gpu["sm_clock_vs_max_pct"] <= 100 and 0 < gpu["power_vs_limit_pct"] <= 100
    assert {r["metric"] for r in report["memory"]["per_rank"]} == {"allocated_bytes"}
    assert all(r["peak_reserved_bytes"] >= r["peak_allocated_bytes"] > 0 for r in report["memory"]["per_rank"])
    assert report["mfu"]["median"] is not None and "fp32" in report["mfu"]["peak_source"]


def test_recorded_h100_run_names_the_straggler_and_fills_the_gpu_sections():
    """sample_traces/straggler-h100: the job above recorded on an H100 (no GPU needed to analyse it): real
    CUDA step timings, NVML telemetry and caching-allocator statistics."""
    report = cli_json(REPO / "sample_traces" / "straggler-h100")
    assert [(s["rank"], s["cause"]) for s in report["stragglers"] if s["persistent"]] == [(1, "compute")]
    assert report["straggler_method"]["wait_source"] == "max(steps.comm_wait_us, collectives)"
    assert report["run"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert "H100 SXM" in report["mfu"]["peak_source"] and report["mfu"]["per_rank"][0]["peak_tflops"] == 67.0
    gpu = report["telemetry"]["per_gpu"][0]
    assert gpu["power_limit_w"] == 700.0 and gpu["sm_clock_max_mhz"] == 1980.0
    assert report["memory"]["per_rank"][0]["metric"] == "allocated_bytes"
