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
    assert result.returncode == 1, result.stderr  # a high finding: the straggler (--fail-on high by default)
    assert str(installed_venv / "share" / "diag" / "sample_traces" / "straggler") in result.stderr
    report = json.loads(result.stdout)
    stragglers = [f for f in report["findings"] if "straggler" in f.get("title", "").lower()]
    assert stragglers, report["findings"]


def _installed_diag(installed_venv: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{installed_venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(
        [installed_venv / "bin" / "diag", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_every_sample_is_installed_and_triage_has_its_hang(installed_venv, tmp_path):
    listed = _installed_diag(installed_venv, tmp_path, "samples")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == sorted(p.name for p in (REPO / "sample_traces").iterdir() if p.is_dir())
    assert str(installed_venv / "share" / "diag" / "sample_traces" / "hang") in listed.stdout
    copied = _installed_diag(installed_venv, tmp_path, "samples", "copy", "hang", "runs/hang")
    assert copied.returncode == 0, copied.stderr
    triage = _installed_diag(installed_venv, tmp_path, "triage", "runs/hang")
    assert triage.returncode == 1, triage.stderr  # a hang verdict
    assert triage.stdout.startswith("HANG") and "rank 1" in triage.stdout
    pipeline = _installed_diag(installed_venv, tmp_path, "samples", "copy", "pipeline", "runs/pipeline")
    assert pipeline.returncode == 0
    report = json.loads(
        _installed_diag(installed_venv, tmp_path, "analyze", "runs/pipeline", "--format", "json").stdout
    )
    assert report["bubble"] is not None


def test_the_docs_the_help_points_to_are_installed(installed_venv, tmp_path):
    page = _installed_diag(installed_venv, tmp_path, "docs", "kineto", "--path")
    assert page.returncode == 0, page.stderr
    assert page.stdout.strip() == str(installed_venv / "share" / "doc" / "diag" / "kineto.md")
    assert "diag docs kineto" in _installed_diag(installed_venv, tmp_path, "analyze", "--help").stdout
    assert "# " in _installed_diag(installed_venv, tmp_path, "docs", "analyze").stdout
