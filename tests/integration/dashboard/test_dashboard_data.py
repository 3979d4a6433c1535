"""The dashboard's data and figures without a browser: bounded figure sizes, rank states, incremental reads,
lazy imports, and pages that fail without breaking."""

from __future__ import annotations

import subprocess
import sys

from diag.dashboard import data as d
from diag.trace.schema import STEPS
from diag.trace.writer import RankWriter


def _manifest(rank: int, finished: bool) -> dict:
    return {
        "schema_version": 1,
        "run_id": "r",
        "rank": rank,
        "world_size": 3,
        "clock_offset_us": 0,
        "finished": finished,
    }


def _steps(writer: RankWriter, steps: range, step_s: float) -> None:
    for s in steps:
        start_us = 1_795_000_000_000_000 + int(s * step_s * 1e6)
        times = {"data_wait_us": 10, "forward_us": 300, "backward_us": 500, "optimizer_us": 100, "comm_wait_us": 50}
        writer.append("steps", STEPS.row(step=s, start_us=start_us, duration_us=1000, samples=8, **times))
    writer.flush()


def test_cli_help_and_analyze_never_import_dash():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from diag.cli import main\n"
        "assert CliRunner().invoke(main, ['--help']).exit_code == 0\n"
        "assert CliRunner().invoke(main, ['analyze', '--help']).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m == 'dash' or m.startswith('dash.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_command_beyond_loopback_warns_and_requires_its_token(tmp_path):
    import os
    import signal
    import time
    import urllib.error
    import urllib.request

    from tests.conftest import REPO

    port = _free_port()
    env = {**os.environ, "DIAG_DASHBOARD_TOKEN": "tok-123"}
    cmd = [
        sys.executable,
        "-m",
        "diag",
        "dashboard",
        str(REPO / "sample_traces" / "straggler"),
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("Serving on" in x for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        output = "".join(lines)
        assert "WARNING: binding 0.0.0.0" in output and "?token=tok-123" in output, output

        def status(url: str) -> int:
            for _ in range(50):
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        return response.status
                except urllib.error.HTTPError as exc:
                    return exc.code
                except urllib.error.URLError:
                    time.sleep(0.2)  # the server prints before it listens
            raise AssertionError(f"no server at {url}")

        assert status(f"http://127.0.0.1:{port}/") == 403
        assert status(f"http://127.0.0.1:{port}/?token=tok-123") == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_slow_analysis_publishes_less_often_but_loses_no_rows(tmp_path):
    """A large run's analysis takes seconds: rows read in between wait for the next publication."""
    import time

    w = RankWriter(tmp_path / "rank00000")
    w.write_manifest(_manifest(0, False))
    _steps(w, range(3), 1.0)
    live = d.LiveTrace(tmp_path, triage=False)
    live.prepare = lambda snap: time.sleep(1.1)  # stands for an analysis that takes over a second
    assert live.refresh()
    _steps(w, range(3, 5), 1.0)
    assert not live.refresh()  # read, but the next publication is 2 x 1.1 s away
    assert len(live.snapshot.trace.steps) == 3
    _steps(w, range(5, 7), 1.0)
    live.refresh()
    live._next_publish_s = 0.0  # that time has come
    live.prepare = None
    assert live.refresh()
    assert live.snapshot.trace.steps["step"].tolist() == list(range(7))
