"""The GPU paths, on a real GPU: CUDA-event device times without host syncs, CUDA allocator statistics,
a real OOM, NVML telemetry and NCCL collectives (one rank). Skipped where there is no GPU."""

import json

import pytest

from diag.launch import run_ranks
from diag.trace.loader import load
from tests.conftest import JOBS, requires_gpu

STEPS = 30


@requires_gpu
def test_gpu_capture_end_to_end(tmp_path):
    results = run_ranks(
        [str(JOBS / "gpu_job.py"), str(tmp_path), str(STEPS)],
        1,
        timeout_s=300,
        env={"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_FR_BUFFER_SIZE": "2000"},
    )
    assert results[0].returncode == 0, results[0].stderr[-4000:]  # sync debug mode "error" would have raised
    truth = json.loads((tmp_path / "truth.json").read_text())
    trace = load(tmp_path)
    steps = trace.steps[trace.steps["step"] < STEPS]
    # device time from CUDA events, resolved later, for every step and phase
    assert len(steps) == STEPS and steps["device_us"].notna().all() and (steps["device_us"] > 0).all()
    assert trace.phases["device_us"].notna().all() and len(trace.phases) == STEPS
    # allocator statistics per step
    memory = trace.memory[trace.memory["step"] < STEPS]
    assert (memory["allocated_peak_bytes"] >= truth["param_bytes"]).all()
    assert (memory["reserved_bytes"] >= memory["allocated_bytes"]).all()
    # the OOM: caught by the job, recorded by diag with the allocator's summary
    assert truth["oom_caught"]
    oom = trace.events[trace.events["kind"] == "oom"]
    assert len(oom) == 1 and (tmp_path / "rank00000" / oom["summary_file"].iloc[0]).exists()
    assert trace.memory["ooms"].max() >= 1
    # NVML telemetry of this rank's GPU
    telemetry = trace.telemetry
    assert len(telemetry) >= 5 and (telemetry["sm_clock_max_mhz"] > 0).all() and (telemetry["power_w"] > 0).all()
    manifest = trace.manifest(0)
    assert manifest.capture["telemetry"].startswith("on") and manifest.backend == "nccl"
    assert manifest.device_name.startswith("NVIDIA") and manifest.nccl_version
    # NCCL collectives: DDP buckets carry every gradient once per step; explicit all-reduces are recorded
    colls = trace.collectives
    ddp = colls[colls["source"] == "ddp"]
    assert (ddp.groupby("step")["bytes"].sum() == truth["param_bytes"]).all()
    explicit = colls[(colls["source"] == "py") & (colls["bytes"] == 4 << 20)]
    assert len(explicit) == STEPS
    assert colls[colls["source"] != "fr"]["seq"].is_unique
    # with TORCH_NCCL_ENABLE_TIMING=1 durations are NCCL's device times: the same CUDA-event durations
    # Flight Recorder reports for those sequence numbers
    fr_ms = {int(seq): ms for seq, ms in truth["fr_durations_ms"].items() if ms is not None}
    timed = explicit[explicit["seq"].isin(fr_ms)]
    assert len(timed) >= STEPS // 2
    for seq, duration_us in zip(timed["seq"], timed["duration_us"]):
        assert abs(duration_us - fr_ms[seq] * 1000) <= 0.02 * fr_ms[seq] * 1000 + 1
    # memory by category (docs/memory.md): DDP keeps the whole model, its gradients and AdamW's two moments
    last = trace.memory[trace.memory["step"] == STEPS - 1].iloc[0]
    assert last["param_bytes"] == truth["param_bytes"] and last["grad_bytes"] == truth["param_bytes"]
    assert 2 * truth["param_bytes"] <= last["optimizer_state_bytes"] <= 2 * truth["param_bytes"] + 1024
    # the OOM with what the GPU held at that moment, and PyTorch's own account of the failed allocation
    from diag.analysis.report import analyze

    (explained,) = analyze(trace).memory.ooms
    assert explained.requested_bytes == 1 << 50 and explained.param_bytes == truth["param_bytes"]
    assert explained.device_total_bytes and explained.non_pytorch_bytes is not None and explained.non_pytorch_bytes > 0
    # NVML's memory of this process (empty only where a pid namespace hides it), above what PyTorch reserved
    used = telemetry["process_mem_used_bytes"].dropna()
    if len(used):
        assert (used >= trace.memory["reserved_bytes"].min()).all()


@requires_gpu
def test_cuda_graph_replayed_under_diag_computes_the_same_and_every_step_is_timed(tmp_path):
    """A step captured in a CUDA graph with diag's hooks on the model and optimizer, replayed inside diag.step:
    the capture succeeds, the losses are those of the same job without diag, and each step has its host and
    device time."""

    def losses(with_diag: bool) -> list[float]:
        trace_dir = tmp_path / ("diag" if with_diag else "plain")
        argv = [str(JOBS / "cuda_graph_job.py"), str(trace_dir), str(STEPS), "1" if with_diag else "0"]
        (result,) = run_ranks(argv, 1, timeout_s=300)
        assert result.returncode == 0, result.stderr[-4000:]
        return json.loads(result.stdout.strip().splitlines()[-1])["losses"]

    # the same kernels on the same inputs; a tolerance only for a cuBLAS algorithm chosen otherwise in a process
    assert losses(True) == pytest.approx(losses(False), rel=1e-6)
    steps = load(tmp_path / "diag").steps
    assert sorted(steps["step"]) == list(range(STEPS))
    assert (steps["duration_us"] > 0).all() and steps["device_us"].notna().all() and (steps["device_us"] > 0).all()
