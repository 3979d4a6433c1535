"""diag.init(prometheus_port=...) in a real 2-rank gloo DDP job: each rank's /metrics, scraped over HTTP while
the job still runs, against what the job did and what it wrote to its trace."""

import socket
import warnings

import pytest

import diag
from diag._warn import DiagWarning
from tests.prometheus.helpers import free_ports, scrape


def test_port_in_use_is_one_warning_and_capture_goes_on(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            session = diag.init(
                tmp_path, telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1"
            )
            for _ in range(3):
                with diag.step():
                    pass
            diag.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert len(messages) == 1 and f"127.0.0.1:{port}" in messages[0] and "capture goes on" in messages[0]
    trace = diag.load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2]
    assert trace.manifest(0).capture["prometheus"].startswith("off: cannot serve")
    assert session.capture_status["prometheus"].startswith("off")


def test_port_is_freed_at_finish(tmp_path):
    port = free_ports(1)
    diag.init(tmp_path / "a", telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1")
    assert "diag_rank_info" in scrape(port)
    diag.finish()
    with pytest.raises(OSError):
        scrape(port, timeout_s=1)
    # a second session in the same process gets the port again
    session = diag.init(
        tmp_path / "b", telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1"
    )
    assert session.capture_status["prometheus"].startswith("on")
    diag.finish()
