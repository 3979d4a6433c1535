"""GPU metrics from NVML. There is no GPU on most machines that run these tests, so the sampler thread is driven
by the real H100 readings in ../shared/fixtures/gpu-h100 (the stand-in answers NVML's calls from them); on a
GPU the real NVML path runs end to end (requires_gpu)."""

import pytest

from diag.commands.telemetry import NodeGpus
from diag.metrics.nvml import decode_sample
from diag.metrics.prometheus import RankLabels, RowMetrics, new_registry
from diag.trace.manifest import parse_manifests
from tests.capture.helpers import ReplayNvml, read_nvml_fixture
from tests.prometheus.helpers import samples, value


@pytest.fixture
def h100(gpu_fixtures):
    return read_nvml_fixture(gpu_fixtures)


def test_throttle_bits_and_xids_become_labelled_series(h100):
    _, readings = h100
    metrics = RowMetrics()
    source = metrics.source(RankLabels(run="r", rank="0", local_rank="0", host="h", gpu_uuid="GPU-x", gpu_model="m"))
    throttled = dict(readings[-1], clock_event_reasons=0x4 | 0x40)  # sw_power_cap and hw_thermal_slowdown
    source.observe("telemetry", [decode_sample(throttled, 0, xid=79), decode_sample(throttled, 0, xid=79)])
    from prometheus_client import generate_latest

    text = generate_latest(new_registry(metrics)).decode()
    active = {s.labels["reason"]: s.value for s in samples(text) if s.name == "diag_gpu_clock_throttle_active"}
    assert active["sw_power_cap"] == 1 and active["hw_thermal_slowdown"] == 1 and active["gpu_idle"] == 0
    assert value(text, "diag_gpu_clock_throttle_reasons") == 0x44
    assert value(text, "diag_gpu_xid_errors_total", xid="79") == 2


class ReplayNodeNvml(ReplayNvml):
    """The recorded H100 as the one GPU of a node, for the node agent's enumeration calls."""

    def __init__(self, static, readings):
        super().__init__(readings)
        self.static = static

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle{index}"

    def nvmlDeviceGetUUID(self, handle):
        return self.static["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self.static["name"].encode()  # older nvidia-ml-py returns bytes


def test_node_agent_labels_each_gpu_and_the_rank_that_uses_it(h100):
    static, readings = h100
    metrics = RowMetrics()
    gpus = NodeGpus(ReplayNodeNvml(static, readings), metrics, host="node7")
    gpus.sample()
    from prometheus_client import generate_latest

    text = generate_latest(new_registry(metrics)).decode()
    (power,) = [s for s in samples(text) if s.name == "diag_gpu_power_usage_watts"]
    assert power.value == pytest.approx(readings[0]["power_mw"] / 1000)
    assert power.labels == {
        "run": "",
        "rank": "",
        "local_rank": "",
        "host": "node7",
        "gpu": "0",
        "uuid": static["uuid"],
        "model": static["name"],
    }
    # once a rank on this host writes a manifest naming this GPU, its series carry the rank
    manifest = {"run_id": "run-b", "rank": 12, "local_rank": 4, "host": "node7", "gpu_uuid": static["uuid"][4:]}
    gpus.assign_ranks(parse_manifests([manifest, dict(manifest, rank=13, host="node8")], []))
    gpus.sample()
    text = generate_latest(new_registry(metrics)).decode()
    (power,) = [s for s in samples(text) if s.name == "diag_gpu_power_usage_watts"]
    assert (power.labels["run"], power.labels["rank"], power.labels["local_rank"]) == ("run-b", "12", "4")
    assert power.value == pytest.approx(readings[1]["power_mw"] / 1000)
