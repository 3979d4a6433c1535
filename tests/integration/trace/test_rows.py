"""Rows are built and read by name: each table's row builder takes keywords only, fills the columns it is not
given with empty cells, and what the writer writes the loader reads back into the same columns."""

from __future__ import annotations

import diag
from diag.trace.schema import STEPS
from diag.trace.writer import RankWriter


def test_rows_resolved_before_a_timed_flush_are_written_by_the_writer_thread(tmp_path):
    """GPU spans' rows wait on CUDA events (diag/capture/device_timer.py); the writer's thread resolves them
    before each timed flush, so they are written even when the training thread stops appending. Here the
    hook appends a row itself (no CUDA on this machine: the real DeviceTimer path runs in
    tests/integration/prometheus/test_gpu_metrics.py on a GPU)."""
    import threading
    import time

    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=0.05)
    threads = []

    def resolve_pending():
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            phases_us = dict.fromkeys(("forward_us", "backward_us", "optimizer_us", "comm_wait_us"), 0)
            writer.append("steps", STEPS.row(step=7, start_us=0, duration_us=900, data_wait_us=0, **phases_us))

    writer.before_flush = resolve_pending
    writer.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (len(threads) >= 2 and any((tmp_path / "rank00000").glob("steps*"))):
        time.sleep(0.05)
    assert any((tmp_path / "rank00000").glob("steps*")), "the resolved row was not flushed by the writer thread"
    writer.close()
    assert set(threads) == {"diag-writer"}
    assert diag.load(tmp_path).steps["step"].tolist() == [7]


def test_a_failing_pre_flush_hook_warns_once_and_the_writer_keeps_flushing(tmp_path):
    import time
    import warnings

    from diag._warn import DiagWarning, reset_for_tests

    reset_for_tests()
    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=0.05)
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    writer.before_flush = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer.start()
        time.sleep(0.4)
        phases_us = dict.fromkeys(("forward_us", "backward_us", "optimizer_us", "comm_wait_us"), 0)
        writer.append("steps", STEPS.row(step=3, start_us=0, duration_us=900, data_wait_us=0, **phases_us))
        time.sleep(0.4)
        assert any((tmp_path / "rank00000").glob("steps*")), "the writer stopped flushing"
        writer.close()
    assert len(calls) == 1
    assert len([w for w in caught if issubclass(w.category, DiagWarning)]) == 1
    assert diag.load(tmp_path).steps["step"].tolist() == [3]
