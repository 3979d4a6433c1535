"""Problems planted at known ranks of synthetic traces (real file format) are found, named and ranked; the
cache, views and JSON contract hold."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from diag.analysis.collective_waits import loaded_waits
from diag.analysis.comms import analyze_comms, busbw_factor
from diag.analysis.peaks import lookup_peak_tflops
from diag.analysis.report import analyze
from diag.trace import cache as trace_cache
from diag.trace.loader import load
from diag.views.html import render_html
from diag.views.text import render_markdown, render_text
from tests.analysis.helpers import REPO, findings_of, make_trace, report_of, steps_row, synthetic


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted")
    plants = make_trace(path)
    return path, plants, report_of(path)


def test_compute_data_and_throttle_stragglers_are_named_with_their_cause(planted):
    _, plants, report = planted
    persistent = {s["rank"]: s["cause"] for s in report["stragglers"] if s["persistent"]}
    assert persistent == {
        plants.compute_straggler: "compute",
        plants.data_straggler: "data",
        plants.throttled: "throttle",
    }


def test_transient_spikes_are_not_called_persistent(planted):
    _, plants, report = planted
    transient = [s for s in report["stragglers"] if not s["persistent"]]
    assert [s["rank"] for s in transient] == [plants.transient]
    assert findings_of(report, "transient_straggler")[0]["ranks"] == [plants.transient]


def test_time_saved_matches_the_planted_slowdown(planted):
    """The compute straggler works 40% longer; fixing it alone brings a step down to the next-slowest rank."""
    _, plants, report = planted
    busy = pd.DataFrame(report["timeline"]["per_rank"]).set_index("rank")["busy_ms"]
    expected_ms = busy[plants.compute_straggler] - busy.drop(plants.compute_straggler).max()
    straggler = next(s for s in report["stragglers"] if s["rank"] == plants.compute_straggler)
    assert straggler["time_saved_per_step_s"] * 1e3 == pytest.approx(expected_ms, rel=0.15)


def test_findings_are_sorted_by_time_lost_and_complete(planted):
    _, _, report = planted
    lost = [f["time_lost_s"] for f in report["findings"]]
    assert lost == sorted(lost, reverse=True)
    for finding in report["findings"]:
        assert set(finding) >= {
            "kind",
            "severity",
            "title",
            "ranks",
            "time_lost_s",
            "time_lost_per_step_s",
            "evidence",
            "advice",
        }
    total_saved = sum(f["time_lost_per_step_s"] for f in findings_of(report, "straggler"))
    busy = pd.DataFrame(report["timeline"]["per_rank"])["busy_ms"]
    assert total_saved * 1e3 == pytest.approx(busy.max() - busy.nsmallest(len(busy) - 3).max(), rel=0.2)


def test_leak_and_throttled_gpu_are_found_at_their_ranks(planted):
    _, plants, report = planted
    assert findings_of(report, "memory_leak")[0]["ranks"] == [plants.leak]
    leak = next(r for r in report["memory"]["per_rank"] if r["rank"] == plants.leak)
    assert leak["growth_bytes_per_step"] == pytest.approx(plants.leak_bytes_per_step, rel=0.01)
    assert findings_of(report, "gpu_throttle")[0]["ranks"] == [plants.throttled]


def test_balanced_synthetic_job_has_no_straggler_finding(tmp_path):
    make_trace(tmp_path, plants=synthetic.Plants())
    report = report_of(tmp_path)
    assert report["stragglers"] == []
    assert not findings_of(report, "straggler") and not findings_of(report, "transient_straggler")


def test_mfu_is_flops_over_step_time_over_peak(planted):
    path, _, _ = planted
    trace = load(path)
    report = analyze(trace, flops_per_step=2e13, peak_tflops=500.0).to_dict()
    steps = trace.steps[trace.steps["step"] >= report["run"]["window"]["first_step"]]
    step_s = (steps["data_wait_us"] + steps["duration_us"]).groupby(steps["step"]).median() / 1e6
    assert report["mfu"]["median"] == pytest.approx((2e13 / step_s / 500e12).median())
    assert (report["mfu"]["flops_source"], report["mfu"]["peak_source"]) == ("cli", "cli")
    default = analyze(trace).to_dict()["mfu"]
    assert "H100 SXM" in default["peak_source"] and default["flops_source"] == "manifest:user"


def test_mfu_says_why_when_the_peak_is_unknown():
    path = REPO / "sample_traces" / "straggler"
    mfu = report_of(path)["mfu"]
    assert mfu["median"] is None and "--peak-tflops" in mfu["reason"]


def test_peak_table_matches_device_names_and_dtypes():
    assert lookup_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16").tflops == 989.4
    assert lookup_peak_tflops("NVIDIA H100 PCIe", "torch.float16").tflops == 756.0
    assert lookup_peak_tflops("NVIDIA A100-SXM4-80GB", "float32").tflops == 19.5
    assert lookup_peak_tflops("NVIDIA H200", "float8_e4m3fn").tflops == 1978.9
    assert lookup_peak_tflops("Tesla V100-SXM2-32GB", "bfloat16").tflops is None
    assert lookup_peak_tflops("AMD Instinct MI300X", "bf16").tflops == 1307.4
    assert lookup_peak_tflops("cpu", "float32").tflops is None


def test_collective_wait_and_bandwidth_follow_nccl_tests_conventions():
    """Two all_reduces over 4 ranks; rank 3 arrives last at both (shortest duration)."""
    rows = []
    for seq, durations in ((1, [900.0, 700.0, 800.0, 100.0]), (2, [300.0, 250.0, 260.0, 200.0])):
        for rank, d in enumerate(durations):
            rows.append(
                {
                    "rank": rank,
                    "step": 0,
                    "pg": "0",
                    "seq": seq,
                    "op": "allreduce",
                    "bytes": 8_000_000,
                    "start_us": 0,
                    "blocking": 1,
                    "duration_us": d,
                }
            )
    coll = pd.DataFrame(rows).astype({"pg": "category", "op": "category", "duration_us": "Float64"})
    waits = loaded_waits(coll, None)
    assert waits.per_rank_step.tolist() == [900, 650, 760, 0]  # blocking: waits (800 + 100, ...) add up
    assert waits.last_arrivals.tolist() == [0, 0, 0, 2]
    (group,) = waits.groups
    assert group.wait_sum_us == 800 + 600 + 700 + 100 + 50 + 60
    steps = pd.DataFrame({"rank": range(4), "step": 0, "data_wait_us": 0, "duration_us": 10_000, "comm_wait_us": 1_000})
    report = analyze_comms(waits, steps, {"0": 4})
    stats = report.collectives[0]
    assert stats.transfer_p50_us == 150.0  # median of the two shortest durations (100, 200)
    assert stats.algbw_gbps == pytest.approx(8_000_000 / 150.0 / 1e3)
    assert stats.busbw_gbps == pytest.approx(stats.algbw_gbps * 2 * 3 / 4)
    assert busbw_factor("all_gather_into_tensor", 8) == pytest.approx(7 / 8)
    assert [r.last_arrival_fraction for r in report.per_rank] == [0.0, 0.0, 0.0, 1.0]
    overlapping = loaded_waits(coll.assign(blocking=0), None)
    assert overlapping.per_rank_step.tolist() == [800, 600, 700, 0]  # overlapping: the longest wait counts


def test_cache_returns_the_same_trace_and_notices_changes(tmp_path):
    make_trace(tmp_path, ranks=4, steps=20)
    first, how_first = trace_cache.load_cached(tmp_path)
    second, how_second = trace_cache.load_cached(tmp_path)
    assert (how_first, how_second) == ("loaded+cached", "cache")
    for name in ("steps", "collectives", "memory", "telemetry"):
        pd.testing.assert_frame_equal(getattr(first, name), getattr(second, name))
    assert second.manifest(2).host == first.manifest(2).host
    steps_csv = tmp_path / "rank00001" / "steps.csv"
    with open(steps_csv, "a") as handle:
        handle.write(steps_row(20, 1795000000000000, 1000, 10, 1, 1, 1, 1, "", 8, 16384))
    third, how_third = trace_cache.load_cached(tmp_path)
    assert how_third == "loaded+cached"
    assert len(third.steps) == len(first.steps) + 1
    assert len(list((tmp_path / ".diag-cache").iterdir())) == 1  # the stale entry was removed


def test_cache_falls_back_when_the_trace_directory_is_not_writable(tmp_path, monkeypatch):
    make_trace(tmp_path / "run", ranks=2, steps=10)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setattr(trace_cache, "cache_roots", lambda path: [blocked / "cache", elsewhere])
    _, how = trace_cache.load_cached(tmp_path / "run")
    assert how == "loaded+cached" and any(elsewhere.iterdir())
    monkeypatch.setattr(trace_cache, "cache_roots", lambda path: [blocked / "cache"])
    trace, how = trace_cache.load_cached(tmp_path / "run")
    assert how == "loaded" and len(trace.steps) == 20


def test_views_render_every_section_and_html_is_self_contained(planted):
    path, plants, _ = planted
    report = analyze(load(path))
    text, markdown, html = render_text(report), render_markdown(report), render_html(report)
    for heading in ("Findings", "Stragglers", "MFU", "Communication", "Memory", "GPU telemetry"):
        assert heading in text and f"## {heading}" in markdown
    assert f"Rank {plants.compute_straggler} is a persistent straggler (compute)" in text
    assert '<script src="http' not in html and "plotly.js" in html.lower()
    assert html.count("plotly-graph-div") >= 5
    json.dumps(report.to_dict(), allow_nan=False)


def test_instances_are_matched_across_ranks_whatever_the_row_order():
    rng = np.random.default_rng(1)
    rows = [
        {
            "rank": r,
            "step": s // 3,
            "pg": pg,
            "seq": s,
            "op": "allreduce",
            "bytes": 64,
            "start_us": 0,
            "blocking": 0,
            "duration_us": float(10 + r),
        }
        for pg in ("0", "7")
        for s in range(1, 40)
        for r in range(3)
    ]
    coll = (
        pd.DataFrame(rows)
        .sample(frac=1.0, random_state=rng.integers(1 << 30))
        .astype({"pg": "category", "op": "category", "duration_us": "Float64"})
    )
    waits = loaded_waits(coll, None)
    assert len(waits.instances) == 78 and (waits.instances["transfer_us"] == 10).all()
    # every row of rank r waits r us for rank 0: so does every step of it
    ranks = waits.per_rank_step.index.get_level_values("rank").to_numpy(dtype=float)
    assert np.array_equal(waits.per_rank_step.to_numpy(), ranks)
    assert sum(g.wait_sum_us for g in waits.groups) == 78 * (0 + 1 + 2)


def test_second_analyze_reuses_the_cached_report_until_the_trace_changes(tmp_path):
    from tests.analysis.helpers import run_cli

    make_trace(tmp_path, ranks=4, steps=20)
    first = run_cli(tmp_path, "--format", "json")
    second = run_cli(tmp_path, "--format", "json")
    assert first.exit_code == second.exit_code == 0
    assert "report read from the cache" in second.stderr and first.stdout == second.stdout
    other_window = run_cli(tmp_path, "--format", "json", "--steps", "5:10")
    assert "report read from the cache" not in other_window.stderr
    assert json.loads(other_window.stdout)["run"]["window"]["last_step"] == 9
    with open(tmp_path / "rank00000" / "steps.csv", "a") as handle:
        handle.write(steps_row(20, 1795000000000000, 1000, 10, 1, 1, 1, 1, "", 8, 16384))
    third = run_cli(tmp_path, "--format", "json")
    assert "report read from the cache" not in third.stderr
    assert json.loads(third.stdout)["run"]["steps"] == 21


def test_straggler_found_from_collectives_when_the_host_never_blocks(tmp_path):
    """As with NCCL on GPUs: collectives are asynchronous, steps.csv records no blocked time, and only the
    collectives' own durations show who the others waited for."""
    plants = make_trace(tmp_path)
    for steps_csv in tmp_path.glob("rank*/steps.csv"):
        frame = pd.read_csv(steps_csv, skiprows=1)
        frame["comm_wait_us"] = 0
        text = steps_csv.read_text().splitlines(keepends=True)[0] + frame.to_csv(index=False)
        steps_csv.write_text(text)
    report = report_of(tmp_path)
    assert report["straggler_method"]["wait_source"] == "collectives"
    persistent = {s["rank"]: s["cause"] for s in report["stragglers"] if s["persistent"]}
    assert persistent == {
        plants.compute_straggler: "compute",
        plants.data_straggler: "data",
        plants.throttled: "throttle",
    }


def test_point_to_point_ops_are_not_matched_across_ranks():
    """send/recv are numbered per rank; two pairs using the same numbers are different transfers, and an
    all_reduce with the same seq in the same group is a different op."""
    rows = [
        {"rank": 0, "op": "send", "seq": 1, "duration_us": 50.0},
        {"rank": 1, "op": "recv", "seq": 1, "duration_us": 900.0},
        {"rank": 2, "op": "send", "seq": 1, "duration_us": 70.0},
        {"rank": 3, "op": "recv", "seq": 1, "duration_us": 800.0},
        *({"rank": r, "op": "allreduce", "seq": 1, "duration_us": 100.0 + r} for r in range(4)),
    ]
    coll = pd.DataFrame([{**r, "step": 0, "pg": "0", "bytes": 64, "start_us": 0, "blocking": 1} for r in rows])
    waits = loaded_waits(coll.astype({"pg": "category", "op": "category", "duration_us": "Float64"}), None)
    assert waits.per_rank_step.tolist() == [0, 1, 2, 3]  # the all_reduce's waits; the sends and recvs wait 0
    assert waits.instances["ranks"].tolist() == [4]  # the all_reduce, matched; each send and recv alone
    counts = sorted((g.op, g.count, g.ranks_max, g.wait_sum_us) for g in waits.groups)
    assert counts == [("all_reduce", 1, 4, 6.0), ("recv", 2, 1, 0.0), ("send", 2, 1, 0.0)]


def test_untimed_buckets_wait_for_the_latest_issue_on_rank_0s_clock():
    """DDP buckets read from gloo's Flight Recorder have issue times and no durations: the wait is the latest
    issue of the same (pg, seq) minus the row's own, once each rank's clock offset is taken out."""
    rank1_ahead_us = 500.0  # rank 1's clock reads 500 us more than rank 0's
    rows = [
        {"rank": 0, "seq": 1, "start_us": 1_000},
        {"rank": 1, "seq": 1, "start_us": 1_000 + 500 + 300},  # issues 300 us after rank 0
        {"rank": 0, "seq": 2, "start_us": 5_000},
        {"rank": 1, "seq": 2, "start_us": 5_000 + 500 - 200},  # 200 us before rank 0
    ]
    coll = pd.DataFrame(
        [{**r, "step": 0, "pg": "0", "op": "all_reduce", "bytes": 64, "blocking": 0, "duration_us": None} for r in rows]
    ).astype({"pg": "category", "op": "category", "duration_us": "Float64"})
    waits = loaded_waits(coll, None, {0: 0.0, 1: rank1_ahead_us})
    assert waits.per_rank_step.tolist() == [300, 200]  # overlapping: each rank's longest wait
    assert waits.last_arrivals.tolist() == [1, 1]
    # without the offsets rank 1 would seem to arrive last both times
    assert loaded_waits(coll, None).last_arrivals.tolist() == [0, 2]
    steps = pd.DataFrame(
        {"rank": [0, 1], "step": [0, 0], "comm_wait_us": [300, 200], "data_wait_us": 0, "duration_us": 9000}
    )
    report = analyze_comms(waits, steps, {"0": 2})
    # untimed, they are still in the table: counted, with their waits from issue times and no bandwidth
    (row,) = report.collectives
    assert (row.op, row.count, row.rows, row.timed_count, row.busbw_gbps) == ("all_reduce", 2, 4, 0, None)
    assert row.wait_total_s == pytest.approx(500e-6) and row.wait_from == "issue times"
    assert "issue times" in report.note
