"""GPU metrics from NVML. There is no GPU on most machines that run these tests, so the sampler thread is driven
by the real H100 readings in ../shared/fixtures/gpu-h100 (the stand-in answers NVML's calls from them); on a
GPU the real NVML path runs end to end (requires_gpu)."""

import socket
import time

import pytest

import diag
from diag.capture.nvml import TelemetrySampler
from diag.metrics.prometheus import PrometheusSink
from diag.trace.writer import RankWriter
from tests.capture.helpers import ReplayNvml, read_nvml_fixture
from tests.conftest import requires_gpu
from tests.prometheus.helpers import free_ports, samples, scrape, value, values


@pytest.fixture
def h100(gpu_fixtures):
    return read_nvml_fixture(gpu_fixtures)


def test_sampled_h100_readings_are_served_in_base_units_with_dcgm_like_labels(tmp_path, h100):
    static, readings = h100
    manifest = {"run_id": "run-a", "rank": 3, "local_rank": 1, "host": "node7", "world_size": 8, "backend": "nccl"}
    manifest |= {"device": "cuda:1", "device_name": static["name"], "gpu_uuid": static["uuid"].removeprefix("GPU-")}
    sink = PrometheusSink(0, "127.0.0.1", manifest)
    writer = RankWriter(tmp_path / "rank00003", flush_interval_s=0.02)
    writer.row_observer = sink.observe
    writer.start()
    sampler = TelemetrySampler(writer, ReplayNvml(readings), handle=None, gpu_index=5, interval_s=0.005)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    writer.close()
    text = scrape(sink.port)
    sink.close()

    recorded = diag.load(tmp_path).telemetry
    assert len(recorded) >= 5
    last = readings[(len(recorded) - 1) % len(readings)]  # the stand-in replays the readings in order
    labels = {"run": "run-a", "rank": "3", "local_rank": "1", "host": "node7", "gpu": "5"}
    labels |= {"uuid": static["uuid"], "model": "NVIDIA H100 80GB HBM3"}
    gpu_samples = [s for s in samples(text) if s.name.startswith("diag_gpu_")]
    assert gpu_samples and all({k: s.labels[k] for k in labels} == labels for s in gpu_samples)
    assert value(text, "diag_gpu_power_usage_watts") == pytest.approx(last["power_mw"] / 1000)
    assert value(text, "diag_gpu_power_limit_watts") == 700.0
    assert value(text, "diag_gpu_utilization_ratio") == pytest.approx(last["util_gpu"] / 100)
    assert value(text, "diag_gpu_memory_utilization_ratio") == pytest.approx(last["util_mem"] / 100)
    assert value(text, "diag_gpu_memory_used_bytes") == last["mem_used"]
    assert value(text, "diag_gpu_memory_total_bytes") == 85520809984
    assert value(text, "diag_gpu_temperature_celsius") == last["temp_c"]
    assert value(text, "diag_gpu_sm_clock_hertz") == last["sm_clock_mhz"] * 1e6
    assert value(text, "diag_gpu_sm_clock_max_hertz") == 1980e6
    assert value(text, "diag_gpu_pcie_tx_bytes_per_second") == last["pcie_tx_kbs"] * 1024
    assert value(text, "diag_gpu_pcie_rx_bytes_per_second") == last["pcie_rx_kbs"] * 1024
    assert value(text, "diag_gpu_ecc_uncorrected_errors_total") == last["ecc_uncorrected_volatile"]
    assert value(text, "diag_gpu_clock_throttle_reasons") == last["clock_event_reasons"] == 0
    assert values(text, "diag_gpu_clock_throttle_active", reason="sw_power_cap") == [0]
    assert values(text, "diag_gpu_xid_errors_total") == []  # no XID in this recording


@requires_gpu
def test_real_nvml_metrics_served_by_a_gpu_rank(tmp_path):
    import torch

    port = free_ports(1)
    session = diag.init(
        tmp_path, watchdog=False, telemetry_interval_s=0.1, flush_interval_s=0.1, prometheus_port=port, dtype="bfloat16"
    )
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(20):
        with diag.step():
            for _ in range(10):
                x = (x @ x).clamp(-1, 1)
    torch.cuda.synchronize()
    time.sleep(0.5)
    text = scrape(port)
    diag.finish()
    uuid = session.manifest["gpu_uuid"]
    (power,) = [s for s in samples(text) if s.name == "diag_gpu_power_usage_watts"]
    assert power.value > 10 and power.labels["uuid"].endswith(uuid) and power.labels["host"] == socket.gethostname()
    assert power.labels["model"] == session.manifest["device_name"]
    assert value(text, "diag_gpu_sm_clock_max_hertz") > 1e8
    assert 0 <= value(text, "diag_gpu_utilization_ratio") <= 1
    assert value(text, "diag_gpu_memory_total_bytes") > 2**30
    assert value(text, "diag_memory_reserved_bytes") >= 2048 * 2048 * 4
    assert value(text, "diag_step_duration_seconds_count") == 20
    assert value(text, "diag_step_device_seconds_total") > 0
