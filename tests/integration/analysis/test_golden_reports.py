"""`diag analyze --format json` on the bundled sample runs (and the real H100 torch.profiler trace) equals the
report recorded in tests/golden/: the JSON contract (docs/analyze.md) holds through refactors.

A golden file changes only when a report is meant to change; then regenerate it with
``python3 tests/analysis/golden.py`` and say in the commit what changed and why.
"""

from __future__ import annotations

import json

import pytest

from tests.analysis.golden import (
    GOLDEN,
    REPO,
    SAMPLE_RUNS,
    differences,
    kineto_dir,
    report_json,
)


@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_sample_run_report_equals_golden(run):
    expected = json.loads((GOLDEN / f"{run}.report.json").read_text())
    found = differences(expected, report_json(REPO / "sample_traces" / run))
    assert not found, f"{len(found)} differences from tests/golden/{run}.report.json:\n" + "\n".join(found[:20])


def test_single_gpu_profiler_trace_report_equals_golden(tmp_path, gpu_fixtures):
    expected = json.loads((GOLDEN / "kineto-h100.report.json").read_text())
    found = differences(expected, report_json(kineto_dir(tmp_path, gpu_fixtures)))
    assert not found, "differences from tests/golden/kineto-h100.report.json:\n" + "\n".join(found[:20])
