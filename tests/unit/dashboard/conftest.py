"""The dashboard app over a trace, its poll thread stopped when the test ends: a poller left running keeps reading
through the tests that follow, and a process with other threads forks no worker processes
(``diag.processes.worker_count``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def dashboard_app():
    """``dashboard_app(trace_dir, **create_app's options)`` -> the app; every app made is stopped afterwards."""
    from diag.dashboard.app import create_app

    made = []

    def make(trace_dir, **options):
        made.append(create_app(trace_dir, **options))
        return made[-1]

    yield make
    for app in made:
        app.live.stop()
