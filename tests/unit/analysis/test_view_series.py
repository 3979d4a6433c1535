"""Series the dashboard draws over every recorded step or sample, computed by the analyses that own them: the
throttle mask (telemetry), per-step throughput (MFU), OOM steps and the memory metric (memory), and the
per-rank step times (the report facade)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.analysis.memory import memory_metric, oom_steps
from diag.analysis.mfu import analyze_mfu, per_step_throughput
from diag.analysis.report import all_step_times, analyze
from diag.analysis.telemetry import SLOWING_MASK, analyze_telemetry, throttled_samples
from diag.trace.loader import load
from diag.trace.schema import MEMORY, TELEMETRY
from tests.analysis.helpers import make_trace


def test_throttle_mask_counts_the_nvml_reasons_that_slow_a_busy_gpu():
    nvml = pytest.importorskip("pynvml")
    slowing = [
        nvml.nvmlClocksEventReasonSwPowerCap,
        nvml.nvmlClocksEventReasonHwSlowdown,
        nvml.nvmlClocksEventReasonSwThermalSlowdown,
        nvml.nvmlClocksEventReasonHwThermalSlowdown,
        nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    ]
    harmless = [
        nvml.nvmlClocksEventReasonNone,
        nvml.nvmlClocksEventReasonGpuIdle,
        nvml.nvmlClocksEventReasonApplicationsClocksSetting,
        nvml.nvmlClocksEventReasonSyncBoost,
        nvml.nvmlClocksEventReasonDisplayClockSetting,
        nvml.nvmlClocksEventReasonGpuIdle | nvml.nvmlClocksEventReasonSyncBoost,
    ]
    assert SLOWING_MASK == sum(slowing) == 0xEC
    mixed = nvml.nvmlClocksEventReasonGpuIdle | nvml.nvmlClocksEventReasonHwThermalSlowdown
    reasons = pd.Series([*slowing, *harmless, mixed, None], dtype="Int64")
    expected = [True] * len(slowing) + [False] * len(harmless) + [True, False]  # no reading: not throttled
    assert throttled_samples(reasons).tolist() == expected


def test_throttle_mask_is_the_one_the_telemetry_shares_use():
    reasons = [0x0, 0x4, 0x1, 0x44, 0x10, 0x8, 0x100, 0x80]  # 4 of 8 samples slowed
    n = len(reasons)
    tel = pd.DataFrame(
        {
            "rank": 0,
            "time_us": np.arange(n) * 1_000_000,
            "gpu": 0,
            "util_pct": 90.0,
            "mem_util_pct": 50.0,
            "mem_used_bytes": 2**30,
            "mem_total_bytes": 80 * 2**30,
            "power_w": 500.0,
            "power_limit_w": 700.0,
            "temp_c": 70.0,
            "sm_clock_mhz": 1500.0,
            "sm_clock_max_mhz": 1980.0,
            "throttle_reasons": reasons,
            "pcie_tx_kib_per_s": 0.0,
            "pcie_rx_kib_per_s": 0.0,
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "xid": None,
            "process_mem_used_bytes": None,
            "other_processes_mem_used_bytes": None,
        }
    )
    tel = tel[["rank", *TELEMETRY.dtypes]].astype(TELEMETRY.dtypes)
    gpu = analyze_telemetry(tel, {}).gpus[0]
    assert throttled_samples(tel["throttle_reasons"]).mean() == gpu.throttled_share == 0.5
    assert gpu.throttled  # above THROTTLED_SHARE
    assert gpu.throttle_share == {
        "gpu_idle": 1 / n,
        "sw_power_cap": 2 / n,
        "hw_slowdown": 1 / n,
        "sync_boost": 1 / n,
        "hw_thermal_slowdown": 1 / n,
        "hw_power_brake_slowdown": 1 / n,
        "display_clock_setting": 1 / n,
    }


def test_per_step_throughput_counts_tokens_once_per_replica_over_the_median_iteration():
    # 4 ranks in 2 tensor-parallel pairs (replicas=2): each pair sees the same 1,000 tokens per rank
    steps = pd.DataFrame(
        {
            "rank": [0, 1, 2, 3] * 2,
            "step": [0] * 4 + [1] * 4,
            "tokens": pd.array([1000] * 8, dtype="Int64"),
            "samples": pd.array([None] * 8, dtype="Int64"),
        }
    )
    times = pd.DataFrame(
        {
            "rank": [0, 1, 2, 3] * 2,
            "step": [0] * 4 + [1] * 4,
            "iteration_us": [0.4e6, 0.5e6, 0.5e6, 3.0e6, 0.25e6, 0.25e6, 0.25e6, 0.25e6],
        }
    )
    out = per_step_throughput(steps, times, replicas=2)
    assert out["step"].tolist() == [0, 1]
    assert out["tokens_per_s"].tolist() == [2000 / 0.5, 2000 / 0.25]  # median rank's iteration, not the slowest
    assert out["samples_per_s"].isna().all()  # none recorded: unknown, not zero
    empty = per_step_throughput(steps, None, 1)
    assert empty.empty and list(empty.columns) == ["step", "tokens_per_s", "samples_per_s"]


def test_per_step_throughput_agrees_with_the_mfu_reports_over_equal_steps():
    steps = pd.DataFrame({"rank": [0, 1] * 3, "step": [0, 0, 1, 1, 2, 2], "tokens": [512] * 6, "samples": [4] * 6})
    times = steps[["rank", "step"]].assign(iteration_us=0.2e6)
    report = analyze_mfu(times, pd.DataFrame(), steps, None, None, 1)
    out = per_step_throughput(steps, times, 1)
    assert out["tokens_per_s"].tolist() == [report.tokens_per_s] * 3 == [1024 / 0.2] * 3
    assert out["samples_per_s"].tolist() == [report.samples_per_s] * 3


def _memory(rows: list[tuple[int, int, int | None]]) -> pd.DataFrame:
    """memory.csv rows of (rank, step, ooms counter): RSS 1 GiB, no CUDA allocator readings."""
    n = len(rows)
    frame = pd.DataFrame(
        {
            column: pd.array([None] * n, dtype=dtype) if dtype == "Int64" else np.zeros(n, dtype=dtype)
            for column, dtype in MEMORY.dtypes.items()
        }
    )
    frame["step"] = [s for _, s, _ in rows]
    frame["ooms"] = pd.array([o for _, _, o in rows], dtype="Int64")
    frame["rss_bytes"] = 2**30
    frame.insert(0, "rank", [r for r, _, _ in rows])
    return frame


def test_oom_steps_from_events_and_counter_increases():
    mem = _memory([(0, 0, 0), (0, 1, 0), (0, 2, 1), (0, 3, 1), (0, 4, 2), (2, 3, 1), (2, 4, 1), (1, 0, None)])
    events = pd.DataFrame({"rank": [1, 0, 1], "step": [5, 2, 6], "kind": ["oom", "oom", "step_error"]})
    out = oom_steps(events, mem)
    # rank 0's counter grew in steps 2 and 4 (step 2 also an event: once); rank 2's first reading already 1
    assert sorted(map(tuple, out[["rank", "step"]].to_numpy().tolist())) == [(0, 2), (0, 4), (1, 5), (2, 3)]
    assert oom_steps(pd.DataFrame(), _memory([(0, 0, None)])).empty


def test_memory_metric_is_cuda_allocated_bytes_when_recorded_else_rss():
    frame = _memory([(0, 0, 0), (0, 1, 0)])
    assert memory_metric(frame) == "rss_bytes"
    frame.loc[1, "allocated_bytes"] = 2**30
    assert memory_metric(frame) == "allocated_bytes"


def test_all_step_times_cover_every_step_and_split_the_window_as_analyze_does(tmp_path):
    make_trace(tmp_path / "run", ranks=4, steps=20)
    trace = load(tmp_path / "run")
    report = analyze(trace)
    times = all_step_times(trace)
    recorded = sorted(trace.steps["step"].unique())
    assert sorted(times.frame["step"].unique()) == recorded
    window = report.run.window
    assert len(recorded) > window.steps_analysed  # warm-up left out of the window, not of these times
    inside = times.frame[times.frame["step"].between(window.first_step, window.last_step)]
    by_step = inside.groupby("step")
    for row in report.timeline.per_step:
        assert by_step["iteration_us"].median()[row["step"]] / 1e3 == pytest.approx(row["iteration_median_ms"])
        assert by_step["busy_us"].max()[row["step"]] / 1e3 == pytest.approx(row["busy_max_ms"])
    assert times.wait_source == report.stragglers.wait_source
