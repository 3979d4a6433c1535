"""``diag triage --watch`` beside a real 3-rank gloo job: the verdict comes while the job still hangs (long before
its collective timeout and the watchdog's own dump), and a healthy job is followed to its end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import start_ranks
from tests.triage.jobs import HANG_JOB, WORLD_SIZE

pytestmark = pytest.mark.slow
WATCH_DEADLINE_S = 120


def _watch(trace_dir: Path, stall_s: float) -> subprocess.Popen:
    command = [sys.executable, "-m", "diag", "triage", "--watch", "--format", "json"]
    command += ["--stall-s", str(stall_s), "--interval", "0.5", str(trace_dir)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _job(scenario: str, trace_dir: Path) -> list[subprocess.Popen]:
    env = {  # the watchdog's default threshold: its dump would come only after 120 s
        "HANG_JOB_PG_TIMEOUT_S": "300",
        "HANG_JOB_THRESHOLD_S": "120",
        "HANG_JOB_HEARTBEAT_S": "1",
    }
    return start_ranks([str(HANG_JOB), scenario, str(trace_dir)], WORLD_SIZE, env)


def test_watch_names_the_missing_rank_while_the_job_hangs(tmp_path):
    trace_dir = tmp_path / "trace"
    procs = _job("loader", trace_dir)  # rank 1's data loader blocks forever before step 3
    watcher = _watch(trace_dir, stall_s=3)
    try:
        out, err = watcher.communicate(timeout=WATCH_DEADLINE_S)
        still_running = [p.poll() is None for p in procs]
        started = min(p.get("start_us") for p in _pending(trace_dir))
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert watcher.returncode == 1, err
    verdict = json.loads(out)
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [1]
    assert all(still_running)  # judged during the hang, not after the timeout ended the job
    assert not list(trace_dir.glob("rank*/hang_dump_*.json"))  # nor from the watchdog's dump (120 s)
    assert "has waited" in err and "judged" in err
    assert started  # the others really were inside the collective


def test_watch_follows_a_healthy_job_to_its_end(tmp_path):
    trace_dir = tmp_path / "trace"
    procs = _job("healthy", trace_dir)
    watcher = _watch(trace_dir, stall_s=3)
    try:
        out, err = watcher.communicate(timeout=WATCH_DEADLINE_S)
    finally:
        for proc in procs:
            proc.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert json.loads(out)["verdict"] == "no_problem"
    assert all(p.returncode == 0 for p in procs)
    assert "every rank ended (finished)" in err


def _pending(trace_dir: Path) -> list[dict]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        beats = [json.loads(p.read_text()) for p in trace_dir.glob("rank*/heartbeat.json")]
        pending = [entry for beat in beats for entry in beat.get("pending", [])]
        if pending:
            return pending
        time.sleep(0.2)
    return []
