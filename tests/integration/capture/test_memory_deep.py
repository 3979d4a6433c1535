"""The opt-in deep memory mode: what is behind a step's memory peak, by module (torch's MemTracker, on CPU here)
and by allocation stack (the CUDA allocator's history: a real run where a GPU is lent, and here the conversion of
a snapshot shaped by hand from torch's documentation, since no GPU exists on this machine)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import diag
from diag.analysis.report import analyze
from diag.cli import main
from diag.dashboard.data import Snapshot
from diag.dashboard.pages import update_memory
from diag.launch import run_ranks
from diag.trace.schema import MEMORY_DEEP_FILE, MEMORY_DEEP_FORMAT
from tests.conftest import JOBS

# tests/jobs/memory_deep_job.py's sizes
IN, WIDE, BATCH, DEEP_STEPS, STEPS = 32, 2048, 64, (2, 3), 5
FLOAT32 = 4
ACT = "DistributedDataParallel.module.act"


def deep_file(trace_dir, rank: int = 0) -> dict:
    return json.loads((trace_dir / f"rank{rank:05d}" / MEMORY_DEEP_FILE).read_text())


@pytest.mark.slow
def test_ddp_job_names_the_module_whose_activations_hold_each_ranks_peak(tmp_path):
    results = run_ranks([str(JOBS / "memory_deep_job.py"), str(tmp_path), str(STEPS)], 2, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        data = deep_file(tmp_path, rank)
        assert data["format"] == MEMORY_DEEP_FORMAT and data["steps"] == list(DEEP_STEPS)
        assert data["allocations"] is None  # CPU: no allocator history
        peak = data["modules"]
        # the ReLU's output (BATCH * (rank + 1) x WIDE float32) is saved for the head's backward: the largest
        # activation alive at the peak, in exactly its true size
        top = peak["top_modules"][0]
        assert top["module"] == ACT
        assert top["activation_bytes"] == BATCH * (rank + 1) * WIDE * FLOAT32
        assert peak["phase"] in ("forward", "backward")
        params = sum((IN * IN, IN, IN * WIDE, WIDE, WIDE, 1)) * FLOAT32
        assert peak["by_category"]["param_bytes"] == params
        assert peak["peak_bytes"] == sum(peak["by_category"].values())
    trace = diag.load(tmp_path)
    assert len(trace.steps) == 2 * STEPS  # the deep steps are ordinary steps otherwise
    report = analyze(trace)
    deep = {d.rank: d for d in report.memory.deep}
    assert sorted(deep) == [0, 1] and deep[1].peak_bytes > deep[0].peak_bytes
    assert deep[1].top_modules[0].activation_bytes == 2 * deep[0].top_modules[0].activation_bytes
    # the dashboard's memory page says the same for the selected rank
    snap = Snapshot(version=1, trace_dir=tmp_path, trace=trace, report=report, run_state="finished")
    summary = str(update_memory(snap, 1)["summary"])
    assert "rank 1: live activations and temporaries by module: " + ACT in summary
    text = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache"]).output
    assert "Memory at the peak (deep mode): rank 1" in text and ACT in text
    page = tmp_path / "report.html"
    CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache", "--html", str(page)])
    assert "At the memory peak (deep mode): live activations and temporaries by module" in page.read_text()
    assert (
        json.loads(
            CliRunner()
            .invoke(main, ["analyze", str(tmp_path), "--format", "json", "--no-cache", "--fail-on", "never"])
            .output
        )["memory"]["deep"][0]["top_modules"][0]["module"]
        == ACT
    )
