"""diag analyze on torch.profiler (Kineto) traces: a real 2-rank gloo job profiled here, and real GPU traces
(HTA's public NCCL traces, an H100 trace) compared with Holistic Trace Analysis."""

import gzip
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from diag.analysis.gpu_time import analyze_gpu_time
from diag.analysis.report import Report, analyze
from diag.cli import main
from diag.trace.kineto import is_nccl_kernel, kernel_kind, load_kineto

# Holistic Trace Analysis 0.5.0 on the same files (TraceAnalysis(trace_dir=...).get_temporal_breakdown() and
# .get_comm_comp_overlap(), HTA_DISABLE_NS_ROUNDING=1 so that it keeps the recorded float timestamps), as
# printed by `python benchmarks/bench_kineto.py --fixtures`, which recomputes them live.
HTA = {
    "hta-public/nccl_parser_config": {
        "idle_pct": 77.23,
        "compute_pct": 17.66,
        "non_compute_pct": 5.10,
        "overlap_pct": 14.76,
    },
    "hta-public/df_index_resolver": {
        "idle_pct": 46.08,
        "compute_pct": 35.55,
        "non_compute_pct": 18.37,
        "overlap_pct": 0.0,
    },
    "gpu-h100": {"idle_pct": 65.91, "compute_pct": 33.21, "non_compute_pct": 0.88, "overlap_pct": None},
}
TOLERANCE_PCT_POINTS = 0.1  # shares of the GPU span, in percentage points (docs/kineto.md)


def _hta_window(trace) -> str:
    """All steps but the last, as HTA analyses them (it drops the last ProfilerStep)."""
    steps = np.sort(trace.steps["step"].unique())
    return f"{steps[0]}:{steps[-1]}"


@pytest.mark.parametrize("name", list(HTA))
def test_gpu_time_agrees_with_hta(name, hta_fixtures, gpu_fixtures):
    path = (hta_fixtures.parent / name) if name.startswith("hta-public") else gpu_fixtures
    trace = load_kineto(path)
    report = analyze(trace, steps=_hta_window(trace))
    (rank,) = report.gpu_time.per_rank
    expected = HTA[name]
    for key in ("idle_pct", "compute_pct", "non_compute_pct"):
        assert getattr(rank, key) == pytest.approx(expected[key], abs=TOLERANCE_PCT_POINTS), key
    if expected["overlap_pct"] is None:
        assert rank.comm_comp_overlap_pct is None and rank.communication_us == 0
    else:
        assert rank.comm_comp_overlap_pct == pytest.approx(expected["overlap_pct"], abs=TOLERANCE_PCT_POINTS)
    assert rank.idle_us + rank.compute_us + rank.non_compute_us == pytest.approx(rank.span_us)


def test_nccl_kernels_of_both_name_styles_count_as_communication(hta_fixtures, tmp_path):
    assert is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert is_nccl_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)") == "communication"
    assert kernel_kind("Memcpy DtoD (Device -> Device)") == "memory"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4>") == "compute"
    old = hta_fixtures / "nccl_parser_config" / "nccl_data.json.gz"
    renamed = tmp_path / "rank0.pt.trace.json.gz"  # the same real trace as NCCL >= 2.19 names its kernels
    renamed.write_bytes(gzip.compress(gzip.decompress(old.read_bytes()).replace(b'"ncclKernel_', b'"ncclDevKernel_')))
    reports = []
    for path in (old.parent, tmp_path):
        trace = load_kineto(path)
        assert (trace.gpu_kernels["kind"] == "communication").sum() == 21  # 15 all_reduce + 6 broadcast
        assert sorted(trace.collectives["op"].astype(str).unique()) == ["allreduce", "broadcast"]
        reports.append(analyze(trace).gpu_time.per_rank[0])
    assert reports[0] == reports[1]
    trace = load_kineto(hta_fixtures / "df_index_resolver")
    assert (trace.gpu_kernels["kind"] == "communication").sum() == 2020
    assert len(trace.collectives) == 2020 and set(trace.collectives["op"].astype(str)) == {"AllReduce"}


def test_bad_files_are_skipped_with_a_reason_and_the_rest_analysed(hta_fixtures, tmp_path):
    good = hta_fixtures / "nccl_parser_config" / "nccl_data.json.gz"
    shutil.copy(good, tmp_path / "good.pt.trace.json.gz")
    data = good.read_bytes()
    (tmp_path / "truncated.pt.trace.json.gz").write_bytes(data[: len(data) // 2])
    plain = gzip.decompress(data)
    (tmp_path / "cut.pt.trace.json").write_bytes(plain[: len(plain) // 3])
    no_rank = json.loads(plain)
    del no_rank["distributedInfo"]
    (tmp_path / "anonymous.json").write_text(json.dumps(no_rank))
    (tmp_path / "worker_rank1.json").write_text(json.dumps(no_rank))
    (tmp_path / "notes.json").write_text('{"not": "a trace"}')
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    reasons = {s["path"].rsplit("/", 1)[-1]: s["reason"] for s in report["run"]["skipped"]}
    assert "gzip" in reasons["truncated.pt.trace.json.gz"] and "skipped" in reasons["truncated.pt.trace.json.gz"]
    assert "truncated JSON" in reasons["cut.pt.trace.json"]
    assert "no distributedInfo.rank" in reasons["anonymous.json"] and "file skipped" in reasons["anonymous.json"]
    assert "rank 1 taken from the file name" in reasons["worker_rank1.json"]
    assert "notes.json" not in reasons  # not a trace at all: not read
    assert report["run"]["ranks_found"] == [0, 1]
    assert [r["rank"] for r in report["gpu_time"]["per_rank"]] == [0, 1]


def test_a_lone_trace_without_rank_is_analysed_as_rank_0_and_said_so(hta_fixtures, tmp_path):
    """The usual single-GPU profile (an AMD ROCm trace, say) has no distributedInfo: one file is one rank."""
    plain = gzip.decompress((hta_fixtures / "nccl_parser_config" / "nccl_data.json.gz").read_bytes())
    no_rank = json.loads(plain)
    del no_rank["distributedInfo"]
    (tmp_path / "profile.json").write_text(json.dumps(no_rank))
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["run"]["ranks_found"] == [0]
    (note,) = [s["reason"] for s in report["run"]["skipped"] if s["path"].endswith("profile.json")]
    assert "analysed as rank 0" in note
    text = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache", "--fail-on", "never"])
    assert text.exit_code == 0 and "analysed as rank 0" in text.output, text.output


def test_report_with_gpu_time_survives_the_cache_round_trip(hta_fixtures):
    report = analyze(load_kineto(hta_fixtures / "nccl_parser_config"))
    again = Report.from_state(json.loads(json.dumps(report.to_state())))
    assert again.gpu_time == report.gpu_time and again.to_dict() == report.to_dict()
    assert any(f.kind == "gpu_idle_time" for f in report.findings)
    from diag.views import render
    from diag.views.html import render_html

    assert "GPU time (torch.profiler trace)" in render(again, "text")
    assert "| 0 |" in render(again, "markdown")
    assert "GPU time per rank" in render_html(again)


def test_no_gpu_time_section_for_diag_traces():
    assert analyze_gpu_time(None, np.arange(3)) is None
