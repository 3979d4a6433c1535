"""The dashboard's worker processes: ``LiveTrace.start`` forks the first read's workers on the thread that starts
it, before its poll thread (a fork beside running threads copies the locks they hold), and the later analyses on
the poll thread fork only when the user asked for workers (``diag dashboard --workers``). Real forked workers on a
small synthetic trace (diag/testing/synthetic.py, 72 ranks: above PARTITIONED_MIN_RANKS), with PROCESS_MIN_RANKS
lowered to it."""

from __future__ import annotations

import threading
import time

import pytest

from diag import processes
from diag.dashboard.data import LiveTrace
from tests.analysis.golden import differences
from tests.analysis.helpers import synthetic

pytestmark = pytest.mark.slow
RANKS, STEPS, PER_STEP = processes.PARTITIONED_MIN_RANKS + 8, 12, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=2)
    return path


@pytest.fixture
def forks(monkeypatch):
    """(threads running when each worker was forked, whether that fork was on the main thread); PROCESS_MIN_RANKS
    lowered to this trace and two cores' worth of workers by default."""
    monkeypatch.setattr(processes, "PROCESS_MIN_RANKS", RANKS)
    monkeypatch.setattr(processes, "default_workers", lambda: 2)
    seen = []
    real = processes.start_worker

    def start_worker(target, *args):
        seen.append((threading.active_count(), threading.current_thread() is threading.main_thread()))
        return real(target, *args)

    monkeypatch.setattr(processes, "start_worker", start_worker)
    return seen


def computed(live: LiveTrace, timeout_s: float = 300):
    live.start()
    try:
        deadline = time.monotonic() + timeout_s
        while live.snapshot.report_source != "computed" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert live.snapshot.report_source == "computed", live.snapshot.analysis_error
        return live.snapshot
    finally:
        live.stop()


def test_the_first_read_is_forked_before_the_poll_thread_and_later_analyses_stay_here(run, forks, monkeypatch):
    # threads earlier tests of this pytest process left running are not counted: this test is about the threads
    # LiveTrace starts itself
    leftover, count = threading.active_count() - 1, threading.active_count
    monkeypatch.setattr(threading, "active_count", lambda: count() - leftover)
    snapshot = computed(LiveTrace(run, poll_interval_s=3600, triage=False, cache=False))
    assert forks == [(1, True), (1, True)]  # the first read's two workers, forked alone on the main thread
    alone = computed(LiveTrace(run, poll_interval_s=3600, triage=False, cache=False, workers=1))
    assert len(forks) == 2  # --workers 1: nothing forked
    assert differences(alone.report.to_dict(), snapshot.report.to_dict()) == []
    assert len(snapshot.trace.ranks_found) == RANKS


def test_beside_a_server_s_threads_nothing_is_forked_unless_asked(run, forks):
    stop = threading.Event()
    server = threading.Thread(target=stop.wait)  # as the web server's threads, started before the poller
    server.start()
    try:
        computed(LiveTrace(run, poll_interval_s=3600, triage=False, cache=False))
        assert forks == []
        computed(LiveTrace(run, poll_interval_s=3600, triage=False, cache=False, workers=2))
    finally:
        stop.set()
        server.join()
    # asked for: the first read's workers from the main thread, then the one pool of the engine's runs (memory
    # and telemetry, the collectives' two stages) from the poll thread
    assert [on_main for _, on_main in forks] == [True, True, False, False]
