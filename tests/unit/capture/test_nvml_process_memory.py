"""Memory PyTorch does not see: NVML's per-process memory (nvmlDeviceGetComputeRunningProcesses) read and decoded,
and set against the allocator's reserved bytes. NVML cannot exist without an NVIDIA GPU and the recorded H100
readings predate the process list, so pynvml's process records are stood in for here (SimpleNamespace with
pynvml's field names, ``pid`` and ``usedGpuMemory``); the real path runs in tests/integration/capture/test_gpu.py on a GPU."""

from __future__ import annotations

import json
import types

import pytest

import diag
from diag.analysis.report import analyze
from diag.capture.memory import memory_row
from diag.metrics.nvml import decode_sample, process_memory, read_sample
from diag.trace.schema import STEPS
from diag.trace.writer import RankWriter
from tests.capture.helpers import ReplayNvml, read_nvml_fixture

GIB = 2**30


class ReplayNvmlWithProcesses(ReplayNvml):
    """The recorded readings, and a process list: this rank's process and one other."""

    def __init__(self, samples, processes):
        super().__init__(samples)
        self.processes = processes

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes]


def test_recorded_h100_readings_without_a_process_list_leave_the_columns_empty(tmp_path, gpu_fixtures):
    _, samples = read_nvml_fixture(gpu_fixtures)
    writer = RankWriter(tmp_path / "rank00000")
    for sample in samples:
        writer.append("telemetry", decode_sample(sample, gpu_index=0, pid=1234))
    writer.close()
    telemetry = diag.load(tmp_path).telemetry
    assert telemetry["process_mem_used_bytes"].isna().all()
    assert telemetry["other_processes_mem_used_bytes"].isna().all()


def test_the_process_list_is_read_and_split_into_this_process_and_the_others(gpu_fixtures):
    _, samples = read_nvml_fixture(gpu_fixtures)
    nvml = ReplayNvmlWithProcesses(samples, [(4242, 8_179_744_768), (777, 2 * GIB), (778, None)])
    reading = read_sample(nvml, handle=None)
    assert reading["processes"] == [[4242, 8_179_744_768], [777, 2 * GIB], [778, None]]
    row = decode_sample(reading, gpu_index=0, pid=4242)
    assert row.process_mem_used_bytes == 8_179_744_768
    assert row.other_processes_mem_used_bytes == 2 * GIB  # NVML did not say what pid 778 holds: not counted
    assert row.mem_used_bytes == samples[0]["mem_used"]  # the rest of the reading is unchanged


def test_process_memory_is_unknown_where_nvml_does_not_say():
    assert process_memory(None, 1) == (None, None)  # no list (an older pynvml, a query that failed)
    assert process_memory([[5, 100]], 1) == (None, 100)  # this pid not listed: another pid namespace
    assert process_memory([[1, None], [5, None]], 1) == (None, None)  # MIG or WDDM: no per-process memory
    assert process_memory([], 1) == (None, 0)  # nothing runs there
    assert process_memory([[1, 7], "junk", [2]], 1) == (7, 0)
    assert process_memory([[1, 7], [2, 3]], None) == (None, 10)  # the node agent: every process is another


def test_memory_outside_pytorch_is_the_process_minus_what_the_allocator_reserved(tmp_path, gpu_fixtures):
    """The real H100 run: its per-step allocator statistics after torch.profiler's steps (reserved 6.27 GB at
    every step end) and its NVML readings over the same steps (8.18 GB used). The GPU ran this one process, so
    its device memory in use stands for the process's (NVML's process list was not recorded)."""
    run = json.loads((gpu_fixtures / "cuda_run_h100.json").read_text())
    _, samples = read_nvml_fixture(gpu_fixtures)
    training = [s for s in samples if s["mem_used"] == max(x["mem_used"] for x in samples)]
    steps = run["memory_steps"][16:]  # after the profiled steps, as long as NVML read 8.18 GB
    first_us, last_us = training[0]["t_ns"] // 1000, training[-1]["t_ns"] // 1000
    step_us = (last_us - first_us) // len(steps)
    writer = RankWriter(tmp_path / "rank00000")
    writer.write_manifest({"schema_version": 1, "rank": 0, "world_size": 1, "device": "cuda:0"})
    for i, record in enumerate(steps):
        start = first_us + i * step_us
        writer.append(
            "steps",
            STEPS.row(
                step=record["step"],
                start_us=start,
                duration_us=step_us,
                data_wait_us=0,
                forward_us=0,
                backward_us=0,
                optimizer_us=0,
                comm_wait_us=0,
            ),
        )
        writer.append("memory", memory_row(record["step"], start + step_us, record, rss=2 * GIB))
    for sample in training:
        writer.append("telemetry", decode_sample({**sample, "processes": [[99, sample["mem_used"]]]}, 0, pid=99))
    writer.close()
    rank = analyze(diag.load(tmp_path), steps="0:").memory.per_rank[0]
    reserved = 6_268_387_328
    assert {s["reserved_bytes.all.current"] for s in steps} == {reserved}
    assert rank.non_pytorch_bytes == 8_179_744_768 - reserved  # 1.91 GB: the CUDA context, cuBLAS, NCCL, CUPTI
    assert rank.other_processes_bytes == 0
    # the dashboard's per-rank bars stack it on the categories (the run's fp32 weights, 117,549,056 parameters
    # by the fixtures' README; this recording has no category rows, so the per-step series is the weights alone)
    import pandas as pd

    from diag.dashboard.figures import memory_categories_figure

    rank.param_bytes = 4 * 117_549_056
    series = pd.DataFrame(
        {"rank": [0], "step": [16], "param_bytes": [rank.param_bytes], "grad_bytes": [None]}
        | {"optimizer_state_bytes": [None], "activation_bytes": [None]}
    )
    figure = memory_categories_figure(series, [rank], None)
    outside = next(t for t in figure.data if t.name == "outside PyTorch")
    assert outside.type == "bar" and float(outside.y[0]) * 2**30 == pytest.approx(rank.non_pytorch_bytes, rel=1e-6)
