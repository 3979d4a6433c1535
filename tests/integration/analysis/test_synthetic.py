"""Problems planted at known ranks of synthetic traces (real file format) are found, named and ranked; the
cache, views and JSON contract hold."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.analysis.helpers import REPO, make_trace, report_of


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted")
    plants = make_trace(path)
    return path, plants, report_of(path)


def test_analyze_command_never_imports_torch(planted):
    path, _, _ = planted
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        f"r = CliRunner().invoke(main, ['analyze', {str(path)!r}, '--format', 'json', '--no-cache', '--fail-on', 'never', '--html', {str(path / 'r.html')!r}]); "
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env={**os.environ}, check=True
    )
    assert out.stdout.strip() == "False"
