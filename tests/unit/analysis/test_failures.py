"""A crashed run is reported as a crash, with the exception, and its failed steps never make a straggler.

The real case: FSDP1 with CPUOffload on CPU-only torch failed in step 0 and `diag analyze` said "[high] Rank 0
is a persistent straggler (compute) +72%" without a word about the crash. Here a real 3-rank gloo DDP job
raises in rank 1's forward at step 2; the other ranks then fail in the gradient all-reduce."""

from __future__ import annotations

import pandas as pd

from diag.analysis.failures import failure_findings, find_failures
from diag.trace.manifest import Manifest


def _events(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_step_error_without_watchdog_or_exit_record_still_counts():
    """watchdog=False: no heartbeat; the rank's last step raised and it never ran diag.finish."""
    events = _events(
        [
            {"rank": 0, "time_us": 2_000, "kind": "oom", "step": 7, "message": "CUDA out of memory. Tried to allocate"},
            {"rank": 1, "time_us": 1_000, "kind": "watchdog_dump", "step": None},
        ]
    )
    manifests = {0: Manifest(0, finished=False), 1: Manifest(1, finished=True)}
    failures = find_failures(events, pd.DataFrame(), manifests)
    assert failures.failed_steps == [7]
    assert [(e.rank, e.how, e.last_step) for e in failures.exits] == [(0, "stopped_after_error", 6)]
    (finding,) = failure_findings(failures)
    assert finding.kind == "crash" and "out of memory" in finding.title


def test_errors_a_rank_survived_are_step_errors_not_a_crash():
    """The user caught the exception and went on (e.g. skipped a bad batch): the steps failed, the run did not."""
    events = _events(
        [
            {"rank": 2, "time_us": 5_000, "kind": "step_error", "step": 4, "error": "ValueError('bad batch')"},
            {"rank": 2, "time_us": 9_000, "kind": "collective_error", "step": 9, "error": "RuntimeError('timeout')"},
        ]
    )
    manifests = {rank: Manifest(rank, finished=True) for rank in range(3)}
    failures = find_failures(events, pd.DataFrame(), manifests)
    assert failures.failed_steps == [4, 9] and failures.exits == []
    (finding,) = failure_findings(failures)
    assert finding.kind == "step_error" and finding.title == "Rank 2 failed in step 4: ValueError('bad batch')"


def test_a_clean_run_has_no_failure_finding():
    assert failure_findings(find_failures(pd.DataFrame(), pd.DataFrame(), {})) == []


def test_exit_without_finish_and_without_error_is_a_note_not_a_crash():
    heartbeats = pd.DataFrame([{"rank": 0, "last_step": 99, "exit": {"how": "exited_without_finish"}}])
    failures = find_failures(pd.DataFrame(), heartbeats, {0: Manifest(0, finished=False)})
    assert [(e.rank, e.how) for e in failures.exits] == [(0, "exited_without_finish")]
    assert failure_findings(failures) == []
    assert "exited without diag.finish()" in failures.notes()[0]


def test_sigterm_without_step_error_is_a_crash():
    heartbeats = pd.DataFrame([{"rank": 3, "last_step": 41, "exit": {"how": "terminated", "signal": "SIGTERM"}}])
    (finding,) = failure_findings(find_failures(pd.DataFrame(), heartbeats, {}))
    assert finding.kind == "crash" and finding.title == "Rank 3 ended abnormally (terminated)"
