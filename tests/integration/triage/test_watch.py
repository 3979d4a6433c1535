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


def _watch(trace_dir: Path, stall_s: float, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "diag", "triage", "--watch", "--format", "json"]
    command += ["--stall-s", str(stall_s), "--interval", "0.5", *extra, str(trace_dir)]
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


def test_watch_serves_the_verdict_and_what_to_do_to_prometheus_until_stopped(tmp_path):
    """With --prometheus-port the verdict of a real hang is served as diag_triage_verdict, with the labels the
    DiagTriageProblem alert pages with (promtool checks the alert in tests/prometheus), until SIGTERM."""
    from tests.prometheus.helpers import free_ports, samples, scrape, wait_until

    trace_dir = tmp_path / "trace"
    port = free_ports(1)
    procs = _job("loader", trace_dir)  # rank 1's data loader blocks forever before step 3
    watcher = _watch(trace_dir, 3, "--prometheus-port", str(port))
    try:

        def served():
            if watcher.poll() is not None:
                raise AssertionError(f"the watch exited: {watcher.communicate()}")
            try:
                found = [s for s in samples(scrape(port)) if s.name == "diag_triage_verdict"]
            except OSError:
                return None
            return found

        (verdict,) = wait_until(served, WATCH_DEADLINE_S, "the watch to serve a verdict", interval_s=0.5)
        judged = [s for s in samples(scrape(port)) if s.name == "diag_triage_judged_timestamp_seconds"]
        assert watcher.poll() is None  # still serving after its verdict
        watcher.terminate()
        out, err = watcher.communicate(timeout=30)
    finally:
        for proc in (*procs, watcher):
            proc.kill()
            proc.communicate()
    printed = json.loads(out)
    assert watcher.returncode == 1, err  # the verdict's exit status, as without the port
    assert verdict.value == 1.0
    assert verdict.labels["verdict"] == printed["verdict"] == "missing_ranks"
    assert verdict.labels["culprit_ranks"] == "1"
    assert verdict.labels["action"] == printed["action"] and verdict.labels["action"] in ("fix_code", "restart")
    assert verdict.labels["why"] == printed["action_why"][:300] and verdict.labels["why"]
    assert verdict.labels["run"]  # the ranks' run id, as their own metrics carry it
    assert judged and abs(judged[0].value - time.time()) < WATCH_DEADLINE_S


def test_prometheus_port_without_watch_is_a_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", "--prometheus-port", "9999", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "add --watch" in result.stderr


def _pending(trace_dir: Path) -> list[dict]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        beats = [json.loads(p.read_text()) for p in trace_dir.glob("rank*/heartbeat.json")]
        pending = [entry for beat in beats for entry in beat.get("pending", [])]
        if pending:
            return pending
        time.sleep(0.2)
    return []
