"""diag compare over trace directories in the real format: synthetic runs with a planted straggler, the bundled
pipeline sample, real torch.profiler traces; the command's cache, errors and imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.analysis.helpers import REPO, make_trace, synthetic

RANKS, STEPS = 16, 60


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    make_trace(root / "base", RANKS, STEPS, plants=synthetic.Plants(), seed=0)
    make_trace(root / "again", RANKS, STEPS, plants=synthetic.Plants(), seed=1)
    make_trace(root / "straggler", RANKS, STEPS, plants=synthetic.Plants(compute_straggler=3), seed=2)
    make_trace(root / "half", RANKS // 2, STEPS, plants=synthetic.Plants(), seed=3)
    return root


def test_compare_never_imports_torch_or_dash(synthetic_runs, tmp_path):
    out = tmp_path / "c.html"
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        f"r = CliRunner().invoke(main, ['compare', {str(synthetic_runs / 'base')!r}, {str(synthetic_runs / 'half')!r}, "
        f"'--no-cache', '--fail-on', 'never', '--format', 'html', '-o', {str(out)!r}]); "
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules, 'dash' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env={**os.environ})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
    page = out.read_text()
    assert page.count("plotly-graph-div") == 3 and "Scaling" in page
