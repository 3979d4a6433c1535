"""A ``diag dashboard`` process these tests start is stopped by Ctrl-C (SIGINT), as in a terminal. A test process
started in the background by a shell without job control (``pytest ... &`` in a script or CI step) ignores SIGINT,
and ``exec`` passes an ignored signal on: the server would then outlive its Ctrl-C. While a test runs, this
process handles SIGINT as an interactive one does, which ``exec`` resets to the default in the server."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def ctrl_c_reaches_the_servers_started():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
