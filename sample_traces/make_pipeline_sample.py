"""Make ``sample_traces/pipeline/``: a real 4-rank pipeline-parallel CPU job (gloo, torch.distributed.pipelining
Schedule1F1B, 8 micro-batches, 4 steps) captured by diag, with stage 2 made twice as slow as the others. Each
stage sleeps 20 ms per micro-batch in forward and 40 ms in backward (80 ms for stage 2): see
``tests/pipeline/pipeline_job.py``. Also writes ``pipeline.bubble.json``, the bubble report of the run.

    python sample_traces/make_pipeline_sample.py        # about 20 s
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import diag  # noqa: E402 - the repository root must be on the path first
from diag.analysis.bubble import analyze_bubble  # noqa: E402
from diag.launch import run_ranks  # noqa: E402

JOB = HERE.parent / "tests" / "pipeline" / "pipeline_job.py"
ARGS = ["1f1b", "8", "4", "--forward-ms", "20", "--backward-ms", "40", "--slow-stage", "2", "--slow-factor", "2"]


def main() -> None:
    target = HERE / "pipeline"
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "pipeline"
        for result in run_ranks([str(JOB), str(trace), *ARGS], 4, timeout_s=300):
            if result.returncode != 0:
                raise SystemExit(f"rank {result.rank} failed:\n{result.stderr[-3000:]}")
        shutil.rmtree(trace / "truth", ignore_errors=True)  # the tests' reference plan, not trace data
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(trace, target)
    report = analyze_bubble(diag.load(target)).to_dict()
    (HERE / "pipeline.bubble.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
