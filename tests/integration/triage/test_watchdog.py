"""The capture side of triage: heartbeats and hang dumps on signals and failures, in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import start_ranks
from tests.triage.jobs import _end_all

pytestmark = pytest.mark.slow  # real processes, a few seconds each
JOB = Path(__file__).resolve().parents[2] / "triage" / "watchdog_job.py"
SINGLE_ENV = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}


def _dumps(rank_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(rank_dir.glob("hang_dump_*.json"))]


def test_sigterm_while_blocked_in_a_collective_dumps_stacks_and_still_terminates(tmp_path):
    trace = tmp_path / "trace"
    procs = start_ranks([str(JOB), "blocked_sigterm", str(trace)], 2, {"TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        deadline = time.monotonic() + 60
        while not (trace / "blocked").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # let rank 0 enter the all_reduce
        sent = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=20)
        took_s = time.monotonic() - sent
    finally:
        _end_all(procs)
    assert procs[0].returncode == -signal.SIGTERM  # ended as SIGTERM would have ended it without diag
    assert took_s < 10
    dumps = _dumps(trace / "rank00000")
    assert [d["reason"] for d in dumps] == ["signal SIGTERM"]
    main = next(t for t in dumps[0]["threads"] if t["main"])
    assert main["frames"][-1]["name"] in ("all_reduce", "wait")  # where it was stuck, not the handler
    assert dumps[0]["pending"][0]["op"] == "all_reduce" and dumps[0]["pending"][0]["seq"] >= 1
    assert dumps[0]["fr_dump"] == "fr_dump.pkl" and (trace / "rank00000" / "fr_dump.pkl").stat().st_size > 0
    heartbeat = json.loads((trace / "rank00000" / "heartbeat.json").read_text())
    assert heartbeat["exit"]["how"] == "terminated" and heartbeat["exit"]["signal"] == "SIGTERM"


def test_sigusr1_dumps_and_the_job_goes_on(tmp_path):
    trace = tmp_path / "trace"
    result = subprocess.run(
        [sys.executable, str(JOB), "sigusr1", str(trace)], env=SINGLE_ENV, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "finished" in result.stdout
    dumps = _dumps(trace / "rank00000")
    assert [d["reason"] for d in dumps] == ["signal SIGUSR1"]
    assert dumps[0]["step"] == 0 and dumps[0]["phase"] == "forward"
    heartbeat = json.loads((trace / "rank00000" / "heartbeat.json").read_text())
    assert heartbeat["state"] == "finished"


def test_watchdog_failure_is_one_warning_and_the_loop_finishes(tmp_path):
    trace = tmp_path / "trace"
    result = subprocess.run(
        [sys.executable, str(JOB), "broken_session", str(trace)],
        env=SINGLE_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "warnings: 1" in result.stdout
    heartbeat = json.loads((trace / "rank00000" / "heartbeat.json").read_text())
    assert heartbeat["state"] == "finished" and heartbeat["last_step"] == 9


def test_sigterm_in_a_forked_child_neither_dumps_nor_kills_the_parent(tmp_path):
    trace = tmp_path / "trace"
    result = subprocess.run(
        [sys.executable, str(JOB), "fork_sigterm", str(trace)],
        env=SINGLE_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"child signal: {int(signal.SIGTERM)}" in result.stdout
    assert _dumps(trace / "rank00000") == []
    heartbeat = json.loads((trace / "rank00000" / "heartbeat.json").read_text())
    assert heartbeat["state"] == "finished"


def test_sigterm_sent_twice_still_leaves_one_complete_dump(tmp_path):
    """Launchers may repeat SIGTERM; the second must not cut the first one's dump short."""
    trace = tmp_path / "trace"
    proc = subprocess.Popen([sys.executable, str(JOB), "sleep", str(trace)], env=SINGLE_ENV)
    try:
        deadline = time.monotonic() + 60
        while not (trace / "sleeping").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
    dumps = _dumps(trace / "rank00000")
    assert [d["reason"] for d in dumps] == ["signal SIGTERM"]
    assert dumps[0]["phase"] == "forward" and dumps[0]["step"] == 0
    heartbeat = json.loads((trace / "rank00000" / "heartbeat.json").read_text())
    assert heartbeat["exit"]["signal"] == "SIGTERM"
