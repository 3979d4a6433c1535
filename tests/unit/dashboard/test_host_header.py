"""Bound to loopback, the dashboard answers only requests addressed to localhost (DNS rebinding, issue 12 item 11)."""

from pathlib import Path

from diag.dashboard.app import require_local_host_header

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "straggler"


def test_only_local_host_headers_are_served(dashboard_app):
    app = dashboard_app(SAMPLE)
    require_local_host_header(app.server, 8050)
    client = app.server.test_client()
    for host in ("127.0.0.1:8050", "localhost:8050", "[::1]:8050", "localhost"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("attacker.example:8050", "127.0.0.1.nip.io:8050", "localhost:9999"):
        assert client.get("/", headers={"Host": host}).status_code == 403, host
