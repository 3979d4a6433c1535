"""The one pool of worker processes (``diag.processes.Workers``) that the analysis engine, the partitioned load
and the dashboard's first read share: real forked workers, each with its own state across calls."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from diag.processes import Workers


def _remember(share, local, channel):
    """Adds the share to what this worker remembers; says how many calls it has seen and its pid."""
    local.setdefault("seen", []).append(share)
    channel.tick(1)
    return os.getpid(), list(local["seen"])


def _columns(share, local, channel):
    for name in ("a", "b"):
        channel.column(name, [share] * 3)
    return f"rest of {share}"


def _fails_on_two(share, local, channel):
    if share == 2:
        raise ValueError(f"share {share} is bad")
    return share


def _killed_on_one(share, local, channel):
    if share == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    time.sleep(0.2)
    return share


def _never_stops(share, local, channel):
    """A thread that keeps the worker's process alive after it is told to stop."""
    threading.Thread(target=threading.Event().wait, daemon=False).start()
    return share


def test_each_worker_keeps_its_state_between_calls_and_serves_different_calls():
    ticks = []
    with Workers(2) as workers:
        first = workers.call(_remember, ["a", "b"], ticks.append)
        second = workers.call(_remember, ["c", "d"], ticks.append)
        streamed = workers.call(_columns, [1, 2], streamed=True)
        only_one = workers.call(_remember, ["e"])
    assert [seen for _, seen in first] == [["a"], ["b"]]
    assert [seen for _, seen in second] == [["a", "c"], ["b", "d"]]  # the same worker serves the same share
    assert [pid for pid, _ in first] == [pid for pid, _ in second] and len({pid for pid, _ in first}) == 2
    assert only_one == [(first[0][0], ["a", "c", "e"])]
    assert ticks == [1, 1, 1, 1]
    assert streamed == [("rest of 1", {"a": [1, 1, 1], "b": [1, 1, 1]}), ("rest of 2", {"a": [2] * 3, "b": [2] * 3})]


def test_a_worker_s_error_is_raised_here_with_its_traceback_and_stops_the_pool():
    workers = Workers(3)
    with workers, pytest.raises(RuntimeError) as raised:
        workers.call(_fails_on_two, [0, 1, 2])
    message = str(raised.value)
    assert "_fails_on_two failed" in message and "ValueError: share 2 is bad" in message
    assert "Traceback (most recent call last)" in message and 'raise ValueError(f"share {share} is bad")' in message
    with pytest.raises(RuntimeError, match="not running"):
        workers.call(_fails_on_two, [0])


def test_a_worker_killed_mid_call_is_an_error_not_a_hang():
    started = time.monotonic()
    with Workers(2) as workers, pytest.raises(RuntimeError, match=r"_killed_on_one stopped .*exit code -9"):
        workers.call(_killed_on_one, [0, 1])
    assert time.monotonic() - started < 10


def test_close_kills_a_worker_that_does_not_stop():
    workers = Workers(2)
    workers.start()
    procs = list(workers._procs)
    assert workers.call(_never_stops, [0, 1]) == [0, 1]
    started = time.monotonic()
    workers.close(stop_timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]


def test_a_pool_of_one_forks_nothing():
    with Workers(1) as workers:
        assert workers._procs == []
