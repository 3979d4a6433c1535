"""``diag triage`` reads the ranks of a large trace in worker processes (``sources.TailRead`` on the engine's
runner), of a small one inline: ``diag.processes.worker_count`` decides. That both read the same is checked in
tests/integration/triage/test_workers.py and, on the real gloo jobs, in test_hangs.py
(test_worker_processes_read_the_same_as_one_process)."""

from __future__ import annotations

import threading

from diag.processes import PROCESS_MIN_RANKS, default_workers, worker_count

RANKS, STEPS, PER_STEP = 12, 30, 5


def test_workers_only_for_a_large_trace_and_never_beside_other_threads(monkeypatch):
    # threads earlier tests of this pytest process left running are not counted
    leftover, count = threading.active_count() - 1, threading.active_count
    monkeypatch.setattr(threading, "active_count", lambda: count() - leftover)
    assert worker_count(PROCESS_MIN_RANKS - 1) == 1
    assert worker_count(PROCESS_MIN_RANKS) == default_workers()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # as in the dashboard's server: no fork beside other threads
    other.start()
    try:
        assert worker_count(10 * PROCESS_MIN_RANKS) == 1
    finally:
        stop.set()
        other.join()
