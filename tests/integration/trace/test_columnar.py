"""Schema version 2 (diag/trace/columnar.py): Arrow stream segments compacted into Parquet, read while written,
and damage named, never a crash."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.analysis.golden import GOLDEN, REPO, SAMPLE_RUNS, differences, report_json
from tests.reliability.corpus import _to_columnar


@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_sample_run_in_v2_gives_the_golden_report(run, tmp_path):
    """The sample runs (CSV, schema 1) rewritten as v2 segments, half compacted and half live, report exactly as
    their golden files say."""
    trace_dir = tmp_path / run
    shutil.copytree(REPO / "sample_traces" / run, trace_dir)
    _to_columnar(trace_dir)
    assert not list(trace_dir.glob("rank*/*.csv"))
    expected = json.loads((GOLDEN / f"{run}.report.json").read_text())
    assert differences(expected, report_json(trace_dir)) == []


_FIRST_FLUSH_IMPORTS = """
import sys, tempfile
from diag.trace.schema import TABLES
from diag.trace.writer import RankWriter
writer = RankWriter(tempfile.mkdtemp(), schema_version=2)
before = set(sys.modules)
for name, spec in TABLES.items():
    writer.append(name, tuple({"category": "x", "Float64": 0.5}.get(c.dtype, 1) for c in spec.columns))
writer.flush()
writer.close()
print(sorted(m.split(".")[0] for m in set(sys.modules) - before))
"""


def test_first_v2_flush_imports_nothing(tmp_path):
    """pyarrow imports pandas the first time it converts Python values: done at init, not by the writer thread's
    first flush, where it held the GIL ~0.4 s mid-step (and made tests/prometheus' scrape race its follower)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _FIRST_FLUSH_IMPORTS], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


