"""The alert rules users page on (dashboards/alerts.yml), tested by promtool itself, against the metric names
diag really exports, and the hang metrics they read, served by a real job that hangs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from diag.launch import start_ranks
from tests.conftest import REPO
from tests.prometheus.helpers import free_ports, samples, scrape, values, wait_until

RULES = REPO / "dashboards" / "alerts.yml"
RULE_TESTS = Path(__file__).resolve().parents[2] / "prometheus" / "alerts_test.yml"
HANG_JOB = Path(__file__).resolve().parents[2] / "prometheus" / "hang_metrics_job.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian's prometheus package; .ci/run installs it)"
)


@needs_promtool
def test_rules_are_valid():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rules_fire_on_faults_and_stay_quiet_on_healthy_series():
    """Each alert fires on its fault, with its labels and text, and not on healthy series, one-off spikes, the
    power cap or a run without history (the cases in alerts_test.yml)."""
    result = subprocess.run(
        [PROMTOOL, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_real_hang_is_served_as_hang_metrics(tmp_path):
    """Rank 0 waits in an all_reduce rank 1 never reaches: its watchdog's stall reaches /metrics with the
    collective's group, op and seq, and the pending age grows; rank 1, sleeping in its step, is stalled with
    no collective."""
    port = free_ports(2)
    procs = start_ranks([str(HANG_JOB), str(tmp_path / "trace"), str(port)], 2)
    try:

        def stalled():
            for proc in procs:
                if proc.poll() is not None:
                    raise AssertionError(f"rank exited early: {proc.communicate()[1][-3000:]}")
            try:
                texts = [scrape(port + r) for r in range(2)]
            except OSError:  # not serving yet (diag.init still running)
                return None
            return texts if all(values(t, "diag_hang_stalled_seconds") for t in texts) else None

        rank0, rank1 = wait_until(stalled, 90, "both ranks to export a stall", interval_s=0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    (stall,) = [s for s in samples(rank0) if s.name == "diag_hang_stalled_seconds"]
    assert stall.labels["op"] == "all_reduce" and stall.labels["seq"] and stall.labels["pg"]
    assert stall.labels["rank"] == "0" and stall.value > 1.0  # past hang_threshold_s
    pending = values(rank0, "diag_collective_pending_seconds", pg=stall.labels["pg"])
    assert pending and pending[0] > 1.0
    (idle,) = [s for s in samples(rank1) if s.name == "diag_hang_stalled_seconds"]
    assert idle.labels["op"] == "" and idle.labels["rank"] == "1" and idle.value > 1.0  # stuck in its step
    assert values(rank0, "diag_heartbeat_timestamp_seconds")
