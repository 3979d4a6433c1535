"""What ``diag dashboard`` writes on its terminal: the start-up lines, and nothing per request unless --verbose;
the ``?token=`` secret on the one line that gives the URL, never again (requests carrying it in their query, a
wrong token, pages, Dash's callbacks); no development-server warning and no colour codes in a redirected log.
A real server process (waitress) answering real HTTP requests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

SAMPLE = REPO / "sample_traces" / "straggler"
TOKEN = "tok-" + "S3cret" * 4
PAGES = ("/", "/stragglers", "/communication", "/memory", "/_dash-layout", "/_dash-dependencies", "/nope", "/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, tries: int = 50) -> int:
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                response.read()
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except urllib.error.URLError:  # not listening yet (a server that says "Serving on" before it binds)
            time.sleep(0.2)
    raise AssertionError(f"no answer from {url}")


def _serve_and_browse(tmp_path: Path, *extra: str) -> tuple[str, list[int], int]:
    """What it printed, each page's status and its exit status once stopped by Ctrl-C (SIGINT)."""
    port = _free_port()
    log = tmp_path / "dashboard.log"
    # -X faulthandler: a server that outlives Ctrl-C prints every thread's stack when aborted (below)
    command = [sys.executable, "-X", "faulthandler", "-m", "diag", "dashboard", str(SAMPLE), "--port", str(port)]
    with open(log, "w") as err:  # redirected: a file, as a service manager or nohup would give it
        proc = subprocess.Popen(
            [*command, "--token", TOKEN, *extra],
            stdout=err,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"},
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while "Serving on" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            statuses = [_get(f"{base}{page}?token={TOKEN}") for page in PAGES]
            statuses.append(_get(f"{base}/?token=wrong-{TOKEN}"))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # where it is stuck, into the log the assertions print
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return log.read_text(), statuses, proc.returncode


def test_the_token_is_printed_once_and_requests_are_not_logged(tmp_path):
    text, statuses, _ = _serve_and_browse(tmp_path)
    assert statuses[0] == 200 and statuses[-1] == 403
    assert text.count(TOKEN) == 1, text
    serving = [line for line in text.splitlines() if TOKEN in line]
    assert serving[0].startswith("Serving on http://127.0.0.1:")
    assert "development server" not in text.lower() and "WARNING: This is" not in text
    assert "\x1b[" not in text
    assert not [line for line in text.splitlines() if " /_dash-" in line or "GET " in line], text
    assert len(text.splitlines()) <= 3, text  # loaded, serving (and nothing per request)


def test_verbose_logs_each_request_without_its_query(tmp_path):
    text, statuses, _ = _serve_and_browse(tmp_path, "--verbose")
    assert statuses[0] == 200
    assert text.count(TOKEN) == 1, text
    requests = [line for line in text.splitlines() if line.startswith("GET ")]
    assert len(requests) == len(PAGES) + 1, text
    assert "GET /stragglers 200 " in text and "GET / 403 " in text
    assert "?" not in "".join(requests) and "\x1b[" not in text


def test_ctrl_c_while_it_polls_ends_it_quietly(tmp_path):
    """Stopped while its poll thread reads every 0.5 s (the shortest period): exit status 0 and nothing said
    after the serving line, neither a read refused by the exiting interpreter's thread pools nor a C++ abort of a
    read cut off by the exit. A run does not always hit the race: it needs Ctrl-C during a read."""
    text, statuses, returncode = _serve_and_browse(tmp_path, "--refresh-s", "0.5")
    assert statuses[0] == 200
    assert returncode == 0, text
    assert not text.split("Serving on", 1)[1].splitlines()[1:], text


@pytest.mark.parametrize("refresh", ["0", "nan"])
def test_a_refresh_that_would_spin_is_refused_before_serving(refresh):
    result = subprocess.run(
        [sys.executable, "-m", "diag", "dashboard", str(SAMPLE), "--refresh-s", refresh],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2 and "--refresh-s" in result.stderr
