"""``pip install diag`` is the analysis alone: every analysis command runs with torch, dash, plotly and waitress
absent, and a part whose extra is missing (capture, the dashboard, the HTML reports) says which to install.

The packages are made absent in a fresh interpreter (``sys.modules[name] = None``: an import of them raises
ImportError, as on a machine without them) rather than in a second virtual environment, which would need the
package index to install diag's remaining dependencies."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
REPO = Path(__file__).resolve().parents[3]


def test_the_package_requires_neither_torch_nor_the_dashboard():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"])
    for name in ("torch", "dash", "plotly", "nvidia-ml-py", "waitress"):
        assert name not in required
    extras = project["optional-dependencies"]
    assert any(r.startswith("torch") for r in extras["capture"])
    assert {r.split(">")[0] for r in extras["dashboard"]} == {"dash", "plotly", "waitress"}
    assert "diag[capture,dashboard,scale]" in extras["test"]  # the README's test command installs everything
