"""Units checked against real GPU readings (an H100's NVML samples and per-step CUDA memory stats, recorded in
/work/shared/fixtures/gpu-h100), and straggler causes that need more than one host or a GPU."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from diag.analysis.findings import FindingContext
from diag.analysis.memory import MemoryReport, RankMemory, analyze_memory, memory_pressure
from diag.analysis.stragglers import RankStepTimes, StragglerReport, find_stragglers
from diag.analysis.telemetry import analyze_telemetry, telemetry_findings
from diag.trace.schema import MEMORY, TELEMETRY


def nvml_rows(path) -> pd.DataFrame:
    """The recorded NVML readings as telemetry.csv rows (NVML reports mW; the schema's unit is W)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    rows = [
        {
            "time_us": r["t_ns"] // 1000,
            "gpu": 0,
            "util_pct": r["util_gpu"],
            "mem_util_pct": r["util_mem"],
            "mem_used_bytes": r["mem_used"],
            "mem_total_bytes": r["mem_total"],
            "power_w": r["power_mw"] / 1000,
            "power_limit_w": r["power_limit_mw"] / 1000,
            "temp_c": r["temp_c"],
            "sm_clock_mhz": r["sm_clock_mhz"],
            "sm_clock_max_mhz": r["sm_clock_max_mhz"],
            "throttle_reasons": r["clock_event_reasons"],
            "pcie_tx_kib_per_s": r["pcie_tx_kbs"],
            "pcie_rx_kib_per_s": r["pcie_rx_kbs"],
            "ecc_corrected": r["ecc_corrected_volatile"],
            "ecc_uncorrected": r["ecc_uncorrected_volatile"],
            "xid": None,
            "process_mem_used_bytes": None,  # not in the recorded readings
            "other_processes_mem_used_bytes": None,
        }
        for r in lines
    ]
    frame = pd.DataFrame(rows).astype(TELEMETRY.dtypes)
    frame.insert(0, "rank", 0)
    return frame, lines


def test_h100_nvml_samples_give_plausible_units(gpu_fixtures):
    tel, raw = nvml_rows(gpu_fixtures / "nvml_samples_h100.jsonl")
    gpu = analyze_telemetry(tel, {0: "h100-host"}).gpus[0]
    assert gpu.power_limit_w == 700.0  # an H100 SXM's limit
    assert gpu.sm_clock_max_mhz == 1980.0
    assert 0 < gpu.power_vs_limit_pct <= 100 and 0 < gpu.sm_clock_vs_max_pct <= 100
    assert gpu.samples == len(raw) and 0 <= gpu.util_mean_pct <= 100
    assert gpu.util_mean_pct == pytest.approx(sum(r["util_gpu"] for r in raw) / len(raw))
    assert not gpu.hot and gpu.ecc_uncorrected == 0 and gpu.xids == []


def test_h100_memory_stats_give_headroom_and_fragmentation(gpu_fixtures):
    run = json.loads((gpu_fixtures / "cuda_run_h100.json").read_text())
    total = json.loads((gpu_fixtures / "nvml_samples_h100.jsonl").read_text().splitlines()[1])["mem_total"]
    rows = [
        {
            "rank": 0,
            "step": m["step"],
            "time_us": m["step"],
            "allocated_bytes": m["allocated_bytes.all.current"],
            "allocated_peak_bytes": m["allocated_bytes.all.peak"],
            "reserved_bytes": m["reserved_bytes.all.current"],
            "reserved_peak_bytes": m["reserved_bytes.all.peak"],
            "alloc_retries": m["num_alloc_retries"],
            "ooms": m["num_ooms"],
            "rss_bytes": 0,
            **dict.fromkeys(("param_bytes", "grad_bytes", "optimizer_state_bytes", "categories_step")),  # no model
        }
        for m in run["memory_steps"]
    ]
    mem = pd.DataFrame(rows).astype({"rank": "int32", **MEMORY.dtypes})
    rank = analyze_memory(mem, {0: total}).per_rank[0]
    peak_reserved = max(m["reserved_bytes.all.peak"] for m in run["memory_steps"])
    assert rank.peak_reserved_bytes == peak_reserved
    assert rank.headroom_pct == pytest.approx(100 * (1 - peak_reserved / total))
    assert 85 < rank.headroom_pct < 95  # ~6 GiB of an 80 GB H100
    assert 0 <= rank.fragmentation_pct < 100 and rank.alloc_retries == 0 and rank.ooms == 0
    assert not rank.near_oom


def times_frame(busy_by_rank: dict[int, float], steps: int = 20, peers: dict[int, int] | None = None) -> RankStepTimes:
    rows = []
    for step in range(steps):
        top = max(busy_by_rank.values())
        for rank, busy in busy_by_rank.items():
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "data_wait_us": 1000.0,
                    "compute_us": busy - 1000.0,
                    "wait_us": top - busy,
                    "busy_us": busy,
                    "iteration_us": top + 500.0,
                    "peers": (peers or {}).get(rank, 0),
                }
            )
    return RankStepTimes(pd.DataFrame(rows), "steps.comm_wait_us")


def test_every_rank_of_a_slow_host_is_called_a_host_straggler():
    busy = {rank: 100_000.0 * (1.3 if 4 <= rank < 8 else 1.0) + rank for rank in range(16)}
    info = pd.DataFrame(
        {"host": [f"node{r // 4}" for r in range(16)], "local_rank": [r % 4 for r in range(16)]}, index=range(16)
    )
    report = find_stragglers(times_frame(busy), info, throttled={}, last_arrival={})
    assert {s.rank: s.cause for s in report.stragglers} == {4: "host", 5: "host", 6: "host", 7: "host"}


def _rank_memory(rank: int, leak: bool = False, retries: int = 0) -> RankMemory:
    nothing = dict.fromkeys(
        ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "headroom_pct", "fragmentation_pct"),
    )
    return RankMemory(
        rank=rank,
        metric="allocated_bytes",
        **nothing,
        alloc_retries=retries,
        ooms=0,
        rss_peak_bytes=None,
        growth_bytes_per_step=4 * 2**20 if leak else 0.0,
        growth_r2=0.99 if leak else 0.0,
        growth_total_bytes=None,
        steps_to_oom=None,
        leak_suspected=leak,
    )


def test_slow_rank_whose_memory_alone_grows_or_retries_is_a_memory_straggler():
    busy = {rank: 100_000.0 * (1.4 if rank in (1, 2) else 1.0) + rank for rank in range(8)}
    info = pd.DataFrame({"host": ["node0"] * 8}, index=range(8))
    memory = MemoryReport([_rank_memory(r, leak=r == 1, retries=5 if r == 2 else 0) for r in range(8)])
    report = find_stragglers(times_frame(busy), info, {}, {}, memory_pressure(memory))
    causes = {s.rank: s.cause for s in report.stragglers}
    assert causes == {1: "memory", 2: "memory"}
    evidence = {s.rank: " ".join(s.evidence) for s in report.stragglers}
    assert "leak suspected" in evidence[1] and "retried 5 times" in evidence[2]
    # the same leak on every rank says nothing about why one rank is slower: compute
    everywhere = MemoryReport([_rank_memory(r, leak=True) for r in range(8)])
    report = find_stragglers(times_frame(busy), info, {}, {}, memory_pressure(everywhere))
    assert {s.rank: s.cause for s in report.stragglers} == {1: "compute", 2: "compute"}


def test_slow_rank_of_two_whose_memory_alone_grows_is_a_memory_straggler():
    """Two ranks, one leaking and slower (the fault suite's 2-rank memory fault at 2x load): the leak singles out
    that rank as much as on eight ranks; on both ranks it explains neither."""
    busy = {0: 140_000.0, 1: 100_000.0}
    info = pd.DataFrame({"host": ["node0"] * 2}, index=range(2))
    memory = MemoryReport([_rank_memory(r, leak=r == 0) for r in range(2)])
    report = find_stragglers(times_frame(busy), info, {}, {}, memory_pressure(memory))
    assert {s.rank: s.cause for s in report.stragglers} == {0: "memory"}
    both = MemoryReport([_rank_memory(r, leak=True) for r in range(2)])
    report = find_stragglers(times_frame(busy), info, {}, {}, memory_pressure(both))
    assert {s.rank: s.cause for s in report.stragglers} == {0: "compute"}


def test_gpu_errors_become_a_high_severity_finding(gpu_fixtures):
    tel, _ = nvml_rows(gpu_fixtures / "nvml_samples_h100.jsonl")
    tel.loc[tel.index[-1], "xid"] = 79  # "GPU has fallen off the bus"
    tel.loc[tel.index[-1], "ecc_uncorrected"] = 2
    report = analyze_telemetry(tel, {0: "h100-host"})
    findings = telemetry_findings(report, FindingContext(None, 0, None, StragglerReport()))
    error = next(f for f in findings if f.kind == "gpu_error")
    assert error.severity == "high" and error.ranks == [0] and "79" in error.evidence[0]


def test_pipeline_stages_are_compared_only_within_themselves():
    """Stage 1 does twice the work by design; rank 2 is slow among the ranks of stage 0."""
    busy = {rank: (100_000.0 if rank < 4 else 200_000.0) + rank for rank in range(8)}
    busy[2] = 130_000.0
    stages = {rank: rank // 4 for rank in range(8)}
    info = pd.DataFrame({"host": [f"node{r}" for r in range(8)]}, index=range(8))
    report = find_stragglers(times_frame(busy, peers=stages), info, throttled={}, last_arrival={})
    assert [(s.rank, s.cause) for s in report.stragglers] == [(2, "compute")]
    assert report.stragglers[0].slowdown == pytest.approx(130_000 / 100_002.0 - 1, rel=0.01)
    everyone = find_stragglers(times_frame(busy), info, throttled={}, last_arrival={})
    assert {s.rank for s in everyone.stragglers} == {4, 5, 6, 7}  # what comparing across stages would claim


def test_pipeline_sample_with_one_rank_per_stage_names_no_straggler():
    from tests.analysis.helpers import REPO, report_of

    report = report_of(REPO / "sample_traces" / "pipeline")
    assert report["stragglers"] == [] and "one rank per stage" in report["straggler_method"]["note"]


def _one_rank_per_stage(data_wait_us: dict[int, float], compute_us: dict[int, float], steps: int = 20):
    rows = []
    generator = np.random.default_rng(0)
    for step in range(steps):
        for rank in data_wait_us:
            wait = data_wait_us[rank] * (1 + 0.05 * generator.standard_normal())
            compute = compute_us[rank]
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "data_wait_us": max(wait, 0.0),
                    "compute_us": compute,
                    "wait_us": 0.0,
                    "busy_us": compute + max(wait, 0.0),
                    "iteration_us": 600_000.0,
                    "peers": rank,  # each rank its own stage
                }
            )
    return RankStepTimes(pd.DataFrame(rows), "steps.comm_wait_us")


def test_pipeline_with_one_rank_per_stage_compares_data_waits_only():
    """Stages compute different amounts (stage 3 twice stage 0's: no straggler); rank 1's loader is 40 ms
    slower than the others': a data straggler, whatever the stages compute."""
    compute = {0: 100_000.0, 1: 120_000.0, 2: 150_000.0, 3: 200_000.0}
    waits = {0: 2_000.0, 1: 42_000.0, 2: 2_000.0, 3: 2_000.0}
    info = pd.DataFrame({"host": ["node0"] * 4}, index=range(4))
    report = find_stragglers(_one_rank_per_stage(waits, compute), info, throttled={}, last_arrival={})
    assert "data wait" in report.note
    assert [(s.rank, s.cause, s.persistent) for s in report.stragglers] == [(1, "data", True)]
    assert report.stragglers[0].excess_data_wait_ms == pytest.approx(40, rel=0.1)
    assert report.jitter is None
    healthy = find_stragglers(_one_rank_per_stage(dict.fromkeys(waits, 2_000.0), compute), info, {}, {})
    assert healthy.stragglers == [] and healthy.compared


def test_pipeline_whose_middle_stages_load_nothing_is_not_compared():
    """Only stage 0 reads batches: one rank with a loader has nobody to be compared with."""
    waits = {0: 5_000.0, 1: 0.0, 2: 0.0, 3: 0.0}
    report = find_stragglers(
        _one_rank_per_stage(waits, dict.fromkeys(waits, 100_000.0)), pd.DataFrame(), throttled={}, last_arrival={}
    )
    assert not report.compared and report.stragglers == [] and "not compared" in report.note


def test_pipeline_stage_spiking_over_its_own_usual_compute_is_a_transient_straggler():
    """Stages' usual work differs (100 to 200 ms a step: no straggler); stage 2 computes 300 ms longer than
    its usual in steps 3, 9 and 15, as a rank stalled by a one-off hiccup does: its own spikes."""
    compute = {0: 100_000.0, 1: 120_000.0, 2: 150_000.0, 3: 200_000.0}
    waits = dict.fromkeys(compute, 1_000.0)
    times = _one_rank_per_stage(waits, compute)
    generator = np.random.default_rng(1)
    work = {
        (rank, step): compute[rank] * (1 + 0.03 * generator.standard_normal())
        + (300_000.0 if rank == 2 and step % 6 == 3 else 0.0)
        for rank in compute
        for step in range(20)
    }
    stage_work = pd.Series(work).rename_axis(["rank", "step"])
    info = pd.DataFrame({"host": ["node0"] * 4}, index=range(4))
    report = find_stragglers(times, info, throttled={}, last_arrival={}, stage_work_us=stage_work)
    assert [(s.rank, s.persistent, s.spike_steps) for s in report.stragglers] == [(2, False, [3, 9, 15])]
    steady = pd.Series({k: v for k, v in work.items() if not (k[0] == 2 and k[1] % 6 == 3)})
    steady = steady.reindex(stage_work.index).fillna(compute[2])
    assert find_stragglers(times, info, {}, {}, stage_work_us=steady).stragglers == []
