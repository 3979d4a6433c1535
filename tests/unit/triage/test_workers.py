"""``diag triage`` reads the ranks of a large trace in worker processes (diag/triage/workers.py): what they read is
what one process reads, row for row, so the verdict is the same. Here the workers are asked for on small
synthetic hangs (diag.testing.synthetic --hang, real trace files) that one process would otherwise read; the real
gloo jobs are compared in test_hangs.py (test_worker_processes_read_the_same_as_one_process)."""

from __future__ import annotations

import os
import threading

from diag.triage.workers import WORKERS_MIN_RANKS, worker_count

RANKS, STEPS, PER_STEP = 12, 30, 5


def test_workers_only_for_a_large_trace_and_never_beside_other_threads():
    assert worker_count(WORKERS_MIN_RANKS - 1) == 1
    cores = len(os.sched_getaffinity(0))
    idle = os.getloadavg()[0] < cores - 0.5  # other work holding most of a core: no workers
    assert worker_count(WORKERS_MIN_RANKS) == (min(cores, 4) if cores >= 2 and idle else 1)  # 4: ProcessEngine's
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # as in the dashboard's server: no fork beside other threads
    other.start()
    try:
        assert worker_count(10 * WORKERS_MIN_RANKS) == 1
    finally:
        stop.set()
        other.join()
