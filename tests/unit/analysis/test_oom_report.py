"""Why it ran out: the OOM report from the real H100 out-of-memory error in the shared fixtures (its message,
``memory_stats()`` and the GPU's NVML readings, recorded through capture's own row and event builders), and
PyTorch's other message formats."""

from __future__ import annotations

import json

import pytest

import diag
from diag.analysis.oom import parse_oom_message
from diag.analysis.report import analyze
from diag.capture.memory import memory_row, oom_event_fields
from diag.metrics.nvml import decode_sample
from diag.trace.schema import STEPS
from diag.trace.writer import RankWriter

GIB, MIB = 2**30, 2**20

# Real messages. H100: the shared fixtures' cuda_oom_h100.json (torch 2.11). With another process on the GPU: a
# T4 (14.57 GiB) OOM from a public GitHub file found through the code search (torch >= 2.6: PYTORCH_ALLOC_CONF).
# Before torch 2.1 the figures were in parentheses; the line is the form of PyTorch's own 1.x message.
OTHER_PROCESS_MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of which 1.58 GiB is "
    "free. Process 2493055 has 12.02 GiB memory in use. Including non-PyTorch memory, this process has 966.00 MiB "
    "memory in use. Of the allocated memory 734.07 MiB is allocated by PyTorch, and 33.93 MiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
OLD_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.90 GiB total capacity; 14.94 GiB already allocated; "
    "7.88 MiB free; 15.16 GiB reserved in total by PyTorch)"
)


def test_h100_message_figures_are_parsed(gpu_fixtures):
    message = parse_oom_message(json.loads((gpu_fixtures / "cuda_oom_h100.json").read_text())["message"])
    assert message.requested_bytes == 4 * GIB
    assert message.device_total_bytes == pytest.approx(79.18 * GIB)
    assert message.device_free_bytes == pytest.approx(314.19 * MIB)
    assert message.process_in_use_bytes == pytest.approx(78.86 * GIB)
    assert message.pytorch_allocated_bytes == pytest.approx(77.56 * GIB)
    assert message.reserved_unallocated_bytes == pytest.approx(14.62 * MIB)
    assert message.other_processes == []


def test_other_processes_and_the_older_format_are_parsed():
    message = parse_oom_message(OTHER_PROCESS_MESSAGE)
    assert message.other_processes == [{"pid": 2493055, "bytes": pytest.approx(12.02 * GIB)}]
    assert message.process_in_use_bytes == pytest.approx(966 * MIB)
    old = parse_oom_message(OLD_MESSAGE)
    assert old.requested_bytes == 20 * MIB and old.device_total_bytes == pytest.approx(15.90 * GIB)
    assert old.pytorch_allocated_bytes == pytest.approx(14.94 * GIB)
    assert old.reserved_unallocated_bytes == pytest.approx((15.16 - 14.94) * GIB)
    cpu = parse_oom_message("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1125899906842624 bytes.")
    assert cpu.requested_bytes == 2**50
    assert parse_oom_message("something else entirely").requested_bytes is None


def h100_oom_trace(tmp_path, gpu_fixtures, message: str | None = None, extra: dict | None = None):
    """One rank that ran out of memory as the real H100 did, written by capture's builders: the memory row of
    the failed step and the ``oom`` event from its ``memory_stats()``, the GPU's size from its NVML reading."""
    oom = json.loads((gpu_fixtures / "cuda_oom_h100.json").read_text())
    nvml = [json.loads(line) for line in (gpu_fixtures / "nvml_samples_h100.jsonl").read_text().splitlines()[1:]]
    stats = oom["memory_stats"]
    writer = RankWriter(tmp_path / "rank00000")
    writer.write_manifest(
        {"schema_version": 1, "rank": 0, "world_size": 1, "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}
    )
    start_us = nvml[0]["t_ns"] // 1000
    writer.append(
        "steps",
        STEPS.row(
            step=0,
            start_us=start_us,
            duration_us=30_000,
            data_wait_us=0,
            forward_us=0,
            backward_us=0,
            optimizer_us=0,
            comm_wait_us=0,
        ),
    )
    writer.append("memory", memory_row(0, start_us + 30_000, stats, rss=2 * GIB))
    writer.append("telemetry", decode_sample({**nvml[0], "t_ns": (start_us + 10_000) * 1000}, gpu_index=0))
    writer.event("oom", step=0, message=message or oom["message"], **oom_event_fields(stats, None), **(extra or {}))
    writer.close()
    return diag.load(tmp_path)


def test_h100_oom_is_explained(tmp_path, gpu_fixtures):
    report = analyze(h100_oom_trace(tmp_path, gpu_fixtures))
    (oom,) = report.memory.ooms
    assert oom.rank == 0 and oom.step == 0
    assert oom.allocated_bytes == 83_283_542_016  # memory_stats' allocated_bytes.all.current at the OOM
    assert oom.shortfall_bytes == pytest.approx(4 * GIB - 314.19 * MIB)
    # 78.86 GiB in use by the process, 77.56 GiB allocated and 14.62 MiB cached by PyTorch: ~1.28 GiB outside it
    assert oom.non_pytorch_bytes == pytest.approx(78.86 * GIB - 83_283_542_016 - 14.62 * MIB)
    assert 1.2 * GIB < oom.non_pytorch_bytes < 1.35 * GIB
    assert oom.cause == "out_of_memory" and "not fragmented" in oom.verdict  # 14.62 MiB cached < 4 GiB asked
    first = oom.advice[0]
    assert first.action.startswith("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments")
    assert first.frees_bytes == pytest.approx(14.62 * MIB) and first.enough is False
    assert oom.param_bytes is None  # this run instrumented no model: the categories are unknown, not guessed
    finding = next(f for f in report.findings if f.kind == "oom")
    assert any("the memory was in use, not fragmented" in line for line in finding.evidence)


def test_categories_at_the_oom_rank_the_advice(tmp_path, gpu_fixtures):
    """The same OOM as if a model had been instrumented: the categories capture would add to the event (a 4B
    bf16 model with Adam's fp32 states under DDP over 8 ranks) split PyTorch's 77.56 GiB, and the advice is sized
    from them. The categories are stand-ins (the recorded run allocated raw blocks); the rest is the real OOM."""
    held = {"param_bytes": 8 * GIB, "grad_bytes": 8 * GIB, "optimizer_state_bytes": 48 * GIB}
    trace = h100_oom_trace(tmp_path, gpu_fixtures, extra=held)
    trace.manifests[0] = trace.manifests[0].__class__.from_json(
        {"world_size": 8, "memory_model": {"sharding": "ddp", "zero_stage": 0}}, 0
    )
    trace.world_size = 8
    (oom,) = analyze(trace).memory.ooms
    assert oom.activation_bytes == pytest.approx(83_283_542_016 - 64 * GIB)
    by_action = {a.action.split(" (")[0]: a for a in oom.advice}
    assert by_action["ZeRO-1"].frees_bytes == pytest.approx(48 * GIB * 7 / 8)
    assert by_action["ZeRO-3 / FSDP FULL_SHARD"].frees_bytes == pytest.approx(64 * GIB * 7 / 8)
    assert oom.advice[0].action.startswith("ZeRO-3") and oom.advice[0].enough is True
    frees = [a.frees_bytes for a in oom.advice if a.frees_bytes is not None]
    assert frees == sorted(frees, reverse=True)


def test_fragmentation_is_named_when_the_cache_held_what_was_asked(tmp_path, gpu_fixtures):
    """A request smaller than what PyTorch held reserved but unallocated: the memory was there, in pieces."""
    message = json.loads((gpu_fixtures / "cuda_oom_h100.json").read_text())["message"].replace(
        "Tried to allocate 4.00 GiB", "Tried to allocate 10.00 MiB"
    )
    (oom,) = analyze(h100_oom_trace(tmp_path, gpu_fixtures, message=message)).memory.ooms
    assert oom.cause == "fragmentation" and "fragmentation" in oom.verdict
    assert oom.advice[0].action.startswith("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments") and oom.advice[0].enough


def test_other_processes_on_the_gpu_are_named(tmp_path, gpu_fixtures):
    (oom,) = analyze(h100_oom_trace(tmp_path, gpu_fixtures, message=OTHER_PROCESS_MESSAGE)).memory.ooms
    assert oom.cause == "other_processes" and oom.other_processes_bytes == pytest.approx(12.02 * GIB)
    assert oom.advice[0].action.startswith("stop the other processes on this GPU (pid 2493055)")
