"""Training stability in diag compare (issue 18): real 2-rank gloo DDP runs of tests/analysis/health_job.py,
which record loss and gradient norm with diag.record: a healthy run against the same job with rank 1's batch
scaled 30x at step 17 (a loss spike), and against one with a NaN in rank 1's batch at step 17 (NaN from then
on: the all-reduce spreads it to every replica)."""

from __future__ import annotations

from diag.analysis.compare_stability import compare_stability
from diag.analysis.health import HealthReport

WORLD, STEPS, PLANT_RANK, PLANT_STEP = 2, 30, 1, 17


def test_runs_without_loss_have_no_stability_section():
    assert compare_stability(HealthReport(), HealthReport()) is None
