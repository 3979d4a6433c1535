"""Every collective is in the communication report, timed or not, and no rank waits more than 100% of its time.

A real 2-rank gloo DDP job with its gradients split into several buckets: gloo's Flight Recorder gives DDP's
buckets issue times only, so before, `comms.collectives` was [] and the waits of the overlapping buckets were
summed (151% of the step on this job)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.analysis.collective_waits import loaded_waits
from diag.analysis.comms import analyze_comms


def test_blocking_collective_without_duration_is_counted_from_issue_times():
    """A blocking collective whose completion was never seen (the rank died in it) used to be dropped."""
    coll = pd.DataFrame(
        {
            "rank": [0, 1],
            "step": [5, 5],
            "pg": pd.Categorical(["0", "0"]),
            "seq": [7, 7],
            "op": pd.Categorical(["all_reduce", "all_reduce"]),
            "bytes": [1024, 1024],
            "start_us": [1_000, 31_000],
            "duration_us": pd.array([None, None], dtype="Float64"),
            "blocking": np.array([1, 1], dtype="int8"),
        }
    )
    waits = loaded_waits(coll, None)
    assert waits is not None and waits.per_rank_step.tolist() == [30_000.0, 0.0]
    steps = pd.DataFrame(
        {
            "rank": [0, 1],
            "step": [5, 5],
            "data_wait_us": [0, 0],
            "duration_us": [20_000, 50_000],
            "comm_wait_us": [0, 0],
        }
    )
    report = analyze_comms(waits, steps, {})
    (row,) = report.collectives
    assert (row.count, row.timed_count, row.total_time_s) == (1, 0, None)
    # rank 0's step lasted 20 ms: its 30 ms wait by issue times is capped there
    assert report.per_rank[0].wait_share_pct == pytest.approx(100.0)
