"""Decoding of real GPU artifacts recorded on an H100 (../shared/fixtures/gpu-h100): NVML readings, CUDA
allocator statistics and a real CUDA OOM. NVML cannot exist on a machine without an NVIDIA GPU, so the
sampler thread is driven by a stand-in that replays the recorded readings; the real path runs in
tests/integration/capture/test_gpu.py where a GPU is present."""

import json
import warnings

import pytest
import torch

import diag
from diag._warn import DiagWarning
from diag.capture.memory import is_out_of_memory, memory_row
from diag.capture.nvml import TelemetrySampler
from diag.metrics.nvml import decode_sample
from diag.trace.writer import RankWriter
from tests.capture.helpers import ReplayNvml, read_nvml_fixture


def test_nvml_readings_decode_to_schema_units(tmp_path, gpu_fixtures):
    static, samples = read_nvml_fixture(gpu_fixtures)
    writer = RankWriter(tmp_path / "rank00000")
    for sample in samples:
        writer.append("telemetry", decode_sample(sample, gpu_index=0))
    writer.close()
    telemetry = diag.load(tmp_path).telemetry
    assert len(telemetry) == len(samples)
    first = samples[0]
    row = telemetry.iloc[0]
    assert row["time_us"] == first["t_ns"] // 1000
    assert row["power_w"] == pytest.approx(first["power_mw"] / 1000)
    assert row["power_limit_w"] == pytest.approx(700.0)  # H100 SXM's 700 W limit
    assert row["sm_clock_max_mhz"] == first["sm_clock_max_mhz"] and row["mem_total_bytes"] == first["mem_total"]
    assert telemetry["util_pct"].max() == max(s["util_gpu"] for s in samples)
    assert telemetry["throttle_reasons"].tolist() == [s["clock_event_reasons"] for s in samples]


def test_sampler_stops_with_one_warning_when_nvml_fails(tmp_path, gpu_fixtures):
    _, samples = read_nvml_fixture(gpu_fixtures)
    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=0.05)
    sampler = TelemetrySampler(writer, ReplayNvml(samples, fail_after=3), handle=None, gpu_index=0, interval_s=0.005)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler.start()
        sampler._thread.join(timeout=5)
    assert not sampler._thread.is_alive()
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert len(messages) == 1 and "fallen off the bus" in messages[0]
    writer.close()
    assert len(diag.load(tmp_path).telemetry) == 3


def test_cuda_memory_stats_decode_per_step(tmp_path, gpu_fixtures):
    run = json.loads((gpu_fixtures / "cuda_run_h100.json").read_text())
    records = run["memory_steps"]
    writer = RankWriter(tmp_path / "rank00000")
    for record in records:
        writer.append("memory", memory_row(record["step"], 0, record, rss=2**30))
    writer.close()
    memory = diag.load(tmp_path).memory
    assert memory["step"].tolist() == [r["step"] for r in records]
    assert memory["allocated_peak_bytes"].tolist() == [r["allocated_bytes.all.peak"] for r in records]
    assert (memory["reserved_bytes"] >= memory["allocated_bytes"]).all()
    assert memory["ooms"].max() == 0


def test_real_cuda_oom_is_recognised_and_recorded(tmp_path, gpu_fixtures):
    oom = json.loads((gpu_fixtures / "cuda_oom_h100.json").read_text())
    error = torch.cuda.OutOfMemoryError(oom["message"])
    assert is_out_of_memory(error)
    assert is_out_of_memory(RuntimeError(oom["message"]))  # older torch raised a plain RuntimeError
    assert not is_out_of_memory(ValueError("shape mismatch"))
    diag.init(tmp_path, telemetry=False)
    with pytest.raises(torch.cuda.OutOfMemoryError), diag.step():
        raise error
    diag.finish()
    events = diag.load(tmp_path).events
    assert events["kind"].tolist() == ["oom"] and "Tried to allocate 4.00 GiB" in events["message"][0]
