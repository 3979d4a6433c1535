"""The golden reports in tests/golden/ and how a report is compared with one; run as a script, it regenerates
them from this checkout (``python3 tests/analysis/golden.py``; say in the commit what changed and why)."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SAMPLE_RUNS = ("straggler", "pipeline", "hang", "straggler-h100", "straggler-h200")
KINETO_TRACE = "kineto_h100_ddp_bf16_rank0.pt.trace.json.gz"
PLACEHOLDER = "<TRACE_DIR>"


def report_json(trace_dir: Path) -> dict:
    """The report as the CLI prints it, with the trace directory's path replaced by a placeholder."""
    from tests.analysis.helpers import analyze_in_subprocess  # here: run as a script, REPO joins sys.path first

    out = analyze_in_subprocess(trace_dir)
    return json.loads(out.replace(str(trace_dir), PLACEHOLDER))


def differences(expected, actual, where: str = "$") -> list[str]:
    """Where two JSON values differ; floats equal to 1e-9 relative (float summation order may vary)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{where}.{k}: missing" for k in expected.keys() - actual.keys()]
        out += [f"{where}.{k}: unexpected" for k in actual.keys() - expected.keys()]
        for key in expected.keys() & actual.keys():
            out += differences(expected[key], actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items expected, {len(actual)} found"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in differences(e, a, f"{where}[{i}]")]
    if isinstance(expected, bool) or isinstance(actual, bool):
        return [] if expected is actual else [f"{where}: {expected!r} != {actual!r}"]
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(actual, numbers):
        return (
            [] if math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-12) else [f"{where}: {expected} != {actual}"]
        )
    return [] if expected == actual else [f"{where}: {expected!r} != {actual!r}"]


def kineto_dir(tmp_path: Path, gpu_fixtures: Path) -> Path:
    trace_dir = tmp_path / "kineto-h100"
    trace_dir.mkdir()
    shutil.copy(gpu_fixtures / KINETO_TRACE, trace_dir)
    return trace_dir


if __name__ == "__main__":  # regenerate the golden files from this checkout
    import tempfile

    sys.path.insert(0, str(REPO))
    from tests.conftest import SHARED_FIXTURES

    for run in SAMPLE_RUNS:
        report = report_json(REPO / "sample_traces" / run)
        (GOLDEN / f"{run}.report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        report = report_json(kineto_dir(Path(tmp), SHARED_FIXTURES / "gpu-h100"))
        (GOLDEN / "kineto-h100.report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(SAMPLE_RUNS) + 1} golden reports to {GOLDEN}")
