"""The dashboard app on a trace directory, shared by the browser tests."""

from __future__ import annotations

from pathlib import Path


def make_app(trace_dir: Path, **kwargs):
    from diag.dashboard.app import create_app
    from diag.dashboard.data import LiveTrace

    live = LiveTrace(
        trace_dir, poll_interval_s=kwargs.pop("poll_s", 0.3), stale_after_s=kwargs.pop("stale_after_s", 30.0)
    )
    live.refresh()
    live.wait_for_triage()
    return create_app(trace_dir, live=live, refresh_ms=kwargs.pop("refresh_ms", 500), **kwargs)
