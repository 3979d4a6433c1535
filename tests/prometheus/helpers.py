"""Scraping and parsing what diag serves, as Prometheus itself would read it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.metrics.nvml import open_nvml
from tests.conftest import REPO


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> list:
    """Every sample of an exposition, as prometheus_client's parser reads it: (name, labels, value)."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def values(text: str, name: str, **labels) -> list[float]:
    """Values of the samples called ``name`` whose labels include ``labels``."""
    return [s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(text: str, name: str, **labels) -> float:
    found = values(text, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def free_ports(count: int) -> int:
    """A base port with ``count`` consecutive free ports (ranks serve on base + local_rank)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65536 and all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


STRAGGLER = REPO / "sample_traces" / "straggler"


no_nvml = pytest.mark.skipif(open_nvml()[0] is not None, reason="this machine has NVML: the agent samples its GPUs")


def start_agent(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "diag", "telemetry", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def scrape_when_up(agent, port, ready):
    """Scrape until ``ready(text)``: the agent serves at once and reads the trace directory just after."""

    def attempt():
        assert agent.poll() is None, agent.communicate()[1]
        try:
            text = scrape(port, timeout_s=2)
        except OSError:
            return None
        return text if ready(text) else None

    return wait_until(attempt, 30, "the agent's metrics", interval_s=0.1)


def stop(agent) -> str:
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=10)
    assert agent.returncode == 0, stderr
    return stderr
