"""diag analyze on torch.profiler (Kineto) traces: a real 2-rank gloo job profiled here, and real GPU traces
(HTA's public NCCL traces, an H100 trace) compared with Holistic Trace Analysis."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from diag.analysis.report import analyze
from diag.cli import main
from diag.launch import run_ranks
from diag.trace.kineto import is_kineto_dir, load_kineto
from tests.conftest import REPO

JOB = REPO / "tests" / "kineto" / "profiler_job.py"
SLOW_RANK = 1

TOLERANCE_PCT_POINTS = 0.1  # shares of the GPU span, in percentage points (docs/kineto.md)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kineto_cpu")
    results = run_ranks([str(JOB), str(out), str(SLOW_RANK)], 2, timeout_s=120)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    truth = {r: json.loads((out / f"truth_rank{r}.json").read_text()) for r in range(2)}
    for name in ("truth_rank0.json", "truth_rank1.json"):
        shutil.move(out / name, out.parent / f"{out.name}_{name}")  # leave only the traces in the directory
    return out, truth


def _hta_window(trace) -> str:
    """All steps but the last, as HTA analyses them (it drops the last ProfilerStep)."""
    steps = np.sort(trace.steps["step"].unique())
    return f"{steps[0]}:{steps[-1]}"


def test_cpu_run_exports_rank_and_steps_match_the_job(cpu_run):
    path, truth = cpu_run
    for rank in range(2):
        info = json.loads((path / f"rank{rank}.pt.trace.json").read_text())["distributedInfo"]
        assert info["rank"] == rank and info["world_size"] == 2
    assert is_kineto_dir(path)
    trace = load_kineto(path)
    assert trace.ranks_found == [0, 1] and trace.skipped == []
    for rank in range(2):
        mine = trace.steps[trace.steps["rank"] == rank].set_index("step")["duration_us"]
        recorded = dict((int(n), us) for n, us in truth[rank]["steps"])
        assert list(mine.index) == [2, 3, 4, 5, 6]  # schedule(wait=1, warmup=1, active=5)
        for step, duration_us in mine.items():
            # ProfilerStep#N spans from prof.step() to prof.step(); the job timed its body inside it
            assert duration_us == pytest.approx(recorded[step], abs=1500), (rank, step)


def test_cpu_run_report_names_the_slow_rank_from_gloo_collectives(cpu_run):
    path, _ = cpu_run
    result = CliRunner().invoke(
        main, ["analyze", str(path), "--format", "json", "--steps", "2:7", "--fail-on", "never"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["run"]["ranks_found"] == [0, 1] and report["run"]["window"]["steps_analysed"] == 5
    ops = {c["op"]: c for c in report["comms"]["collectives"]}
    assert ops["all_reduce"]["count"] == 10  # per step: DDP's bucket and the explicit all_reduce
    assert report["straggler_method"]["wait_source"] == "collectives"
    assert [s["rank"] for s in report["stragglers"]] == [SLOW_RANK]
    assert report["gpu_time"]["per_rank"] == [] and "CPU-only" in report["gpu_time"]["note"]


def test_gpu_time_agrees_with_hta_live(hta_fixtures):
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed")
    path = hta_fixtures / "nccl_parser_config"
    code = (
        "import json, sys; from hta.trace_analysis import TraceAnalysis; "
        f"a = TraceAnalysis(trace_dir={str(path)!r}); "
        "b = a.get_temporal_breakdown(visualize=False).iloc[0]; o = a.get_comm_comp_overlap(visualize=False).iloc[0]; "
        "print(json.dumps([float(b['idle_time_pctg']), float(b['compute_time_pctg']), float(o['comp_comm_overlap_pctg'])]))"
    )
    env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    idle, compute, overlap = json.loads(out.stdout.strip().splitlines()[-1])
    trace = load_kineto(path)
    (rank,) = analyze(trace, steps=_hta_window(trace)).gpu_time.per_rank
    assert rank.idle_pct == pytest.approx(idle, abs=TOLERANCE_PCT_POINTS)
    assert rank.compute_pct == pytest.approx(compute, abs=TOLERANCE_PCT_POINTS)
    assert rank.comm_comp_overlap_pct == pytest.approx(overlap, abs=TOLERANCE_PCT_POINTS)


def test_analyze_on_kineto_traces_never_imports_torch(hta_fixtures):
    path = hta_fixtures / "nccl_parser_config"
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        f"r = CliRunner().invoke(main, ['analyze', {str(path)!r}, '--format', 'json', '--fail-on', 'never']); "
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"
