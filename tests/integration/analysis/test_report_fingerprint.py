"""A cached report is served while the analysis code is the same code, whatever its files' modification times
(a reinstall, a copy, a checkout), and never once a module that makes reports has changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import diag

PACKAGE = Path(diag.__file__).parent
PRINT_FINGERPRINT = "from diag.analysis.report import options_fingerprint; print(options_fingerprint(steps=None))"


def _fingerprint(site: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PRINT_FINGERPRINT],
        capture_output=True,
        text=True,
        check=True,
        cwd=site,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    return result.stdout.strip()


def _copy_of_diag(site: Path) -> Path:
    # shutil.copy, not copy2: the copies get new modification times, as a reinstall gives them
    shutil.copytree(PACKAGE, site / "diag", copy_function=shutil.copy, ignore=shutil.ignore_patterns("__pycache__"))
    return site


# the triage module names a failed job's culprit in the report (analysis.report's judge_failure)
@pytest.mark.parametrize("module", ["analysis/stragglers.py", "triage/analysis.py"])
def test_the_same_code_elsewhere_keeps_the_fingerprint_and_an_edit_changes_it(tmp_path, module):
    first = _fingerprint(_copy_of_diag(tmp_path / "a"))
    second = _fingerprint(_copy_of_diag(tmp_path / "b"))
    assert first == second
    edited = tmp_path / "b" / "diag" / module
    edited.write_text(edited.read_text() + "\nSEVERITY_EDITED = True\n")
    assert _fingerprint(tmp_path / "b") != first
