"""Decoding of real GPU artifacts recorded on an H100 (../shared/fixtures/gpu-h100): NVML readings, CUDA
allocator statistics and a real CUDA OOM. NVML cannot exist on a machine without an NVIDIA GPU, so the
sampler thread is driven by a stand-in that replays the recorded readings; the real path runs in
tests/integration/capture/test_gpu.py where a GPU is present."""

import time

import pytest

import diag
from diag.capture.nvml import TelemetrySampler
from diag.trace.writer import RankWriter
from tests.capture.helpers import ReplayNvml, read_nvml_fixture


def test_sampler_thread_writes_recorded_readings(tmp_path, gpu_fixtures):
    _, samples = read_nvml_fixture(gpu_fixtures)
    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=0.05)
    writer.start()
    sampler = TelemetrySampler(writer, ReplayNvml(samples), handle=None, gpu_index=3, interval_s=0.01)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    writer.close()
    telemetry = diag.load(tmp_path).telemetry
    assert len(telemetry) >= 5 and (telemetry["gpu"] == 3).all()
    assert telemetry["power_w"].tolist()[:5] == pytest.approx([s["power_mw"] / 1000 for s in samples[:5]])
