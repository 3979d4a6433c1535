"""The README's first command from a plain (non-editable) install: a wheel built from this checkout, installed
into a fresh virtual environment, runs ``diag analyze`` with no argument on the bundled sample run.

The venv sees the system site-packages only for diag's dependencies (torch, pandas, ...): diag itself comes
from the wheel (checked), so the sample run must have been installed with it, not found in the checkout.
"""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plain-install")
    wheel_dir = root / "wheel"
    # --no-build-isolation: build with the setuptools already installed, no download
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheel_dir, REPO],
        check=True,
        capture_output=True,
    )
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    (wheel,) = wheel_dir.glob("diag-*.whl")
    # --force-reinstall: a diag of the same version installed system-wide (an editable install of a checkout)
    # would otherwise count as already there, and the venv would import that one instead of the wheel
    subprocess.run(
        [env_dir / "bin" / "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel],
        check=True,
        capture_output=True,
    )
    return env_dir


def test_diag_analyze_without_argument_runs_the_installed_sample(installed_venv, tmp_path):
    python = installed_venv / "bin" / "python"
    # cwd outside the checkout and no PYTHONPATH, so nothing can be imported from the source tree
    env = {"PATH": f"{installed_venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run(
        [python, "-c", "import diag; print(diag.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert where.returncode == 0, where.stderr
    assert str(installed_venv) in where.stdout, f"diag imported from {where.stdout}, not the wheel"

    result = subprocess.run(
        [installed_venv / "bin" / "diag", "analyze", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert str(installed_venv / "share" / "diag" / "sample_traces" / "straggler") in result.stderr
    report = json.loads(result.stdout)
    stragglers = [f for f in report["findings"] if "straggler" in f.get("title", "").lower()]
    assert stragglers, report["findings"]
