"""The Grafana dashboards query only what diag exports (the fleet one: every GPU of a node, claimed by a rank
or not), the metric table of docs/prometheus.md is the one the code defines, and the exported names follow
Prometheus conventions. The exported set is read from a live registry fed with real runs (the bundled sample
traces, one with H100 telemetry), not from a list."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
FLEET = REPO / "dashboards" / "diag-gpu-fleet.json"


def test_dashboards_are_current(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "dashboards" / "make_dashboards.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [p.name for p in DASHBOARDS]
    assert FLEET in DASHBOARDS
    for path in DASHBOARDS:
        assert json.loads((tmp_path / path.name).read_text()) == json.loads(path.read_text()), f"regenerate {path.name}"
