"""Rank-step tables of a synchronous job built from a ranks x steps matrix of busy times, and the noise of a
healthy job on a busy host, for the straggler analysis's noise tests (tests/unit and tests/integration)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.analysis.findings import FindingContext
from diag.analysis.stragglers import RankStepTimes, find_stragglers, straggler_findings


def times_of(busy_us: np.ndarray, data_wait_us: np.ndarray | None = None) -> RankStepTimes:
    """A synchronous job's rank-step table from a ranks x steps matrix of busy times: every rank's iteration lasts
    as long as the busiest rank's, the rest of it spent waiting in the step's collectives."""
    ranks, steps = busy_us.shape
    data = np.full_like(busy_us, 500.0) if data_wait_us is None else data_wait_us
    top = np.tile(busy_us.max(axis=0), ranks)
    busy = busy_us.reshape(-1)
    frame = pd.DataFrame(
        {
            "rank": np.repeat(np.arange(ranks), steps),
            "step": np.tile(np.arange(steps), ranks),
            "data_wait_us": data.reshape(-1),
            "duration_us": top - data.reshape(-1),
            "wait_us": top - busy,
            "compute_us": busy - data.reshape(-1),
            "busy_us": busy,
            "iteration_us": top,
            "peers": 0,
        }
    )
    return RankStepTimes(frame, "steps.comm_wait_us")


def judged(busy_us: np.ndarray, data_wait_us: np.ndarray | None = None):
    times = times_of(busy_us, data_wait_us)
    report = find_stragglers(times, pd.DataFrame(), {}, {})
    step_s = float(np.median(busy_us.max(axis=0))) / 1e6
    return report, straggler_findings(report, FindingContext(step_s, busy_us.shape[1], times, report))


def busy_host_noise(rng, ranks: int, steps: int = 40, typical_us: float = 30_000.0, spread: float = 0.3) -> np.ndarray:
    """A healthy job on a busy host, as recorded: every rank alike, with its noise (``spread``: the lognormal
    sigma of a step's work; 0.3 for the demo's matmuls on a loaded 2-core host)."""
    busy = typical_us * rng.lognormal(0.0, spread, (ranks, steps))
    preempted = rng.random((ranks, steps)) < 0.1  # the scheduler gives the core to other work for a while
    busy += preempted * rng.exponential(typical_us, (ranks, steps))
    machine, burner = steps // 4, steps * 3 // 8  # 10 and 15 of 40 steps
    start = rng.integers(0, steps - machine)
    busy[:, start : start + machine] *= 2.0  # the whole machine slows down for a stretch
    rank, start = rng.integers(ranks), rng.integers(0, steps - burner)
    busy[rank, start : start + burner] *= 1.5  # a CPU burner shares this rank's core for a stretch
    return busy
