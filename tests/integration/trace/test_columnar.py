"""Schema version 2 (diag/trace/columnar.py): Arrow stream segments compacted into Parquet, read while written,
and damage named, never a crash."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from diag.trace.columnar import PARQUET_SUFFIX, StreamSegmentWriter, arrow_schema, write_parquet
from diag.trace.loader import load
from diag.trace.schema import STEPS, segment_name
from tests.analysis.golden import GOLDEN, REPO, SAMPLE_RUNS, differences, report_json
from tests.reliability.corpus import _to_columnar
from tests.trace.helpers import step_row as loader_step_row


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


def step_row(step: int, loss=None) -> tuple:
    return loader_step_row(step, loss=loss, first_start_us=1_795_000_000_000_000)  # a real epoch time


def rank_dir(tmp_path: Path, rank: int = 0) -> Path:
    """A rank directory with its manifest, as diag.init leaves it."""
    path = tmp_path / f"rank{rank:05d}"
    path.mkdir(parents=True, exist_ok=True)
    manifest = {"rank": rank, "world_size": 2 if rank else 1, "run_id": "r", "schema_version": 2}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_segment_claiming_more_rows_than_its_bytes_hold_is_refused_before_decoding(tmp_path):
    """42 million constant rows are 2.6 MB of Parquet and gigabytes once read: refused from the file's
    metadata, with the reason; rank 1's rows are still read."""
    path = rank_dir(tmp_path)
    rows = 3_000_000
    schema = arrow_schema(STEPS)
    columns = [
        pa.repeat(pa.scalar(1, field.type), rows) if pa.types.is_integer(field.type) else pa.nulls(rows, field.type)
        for field in schema
    ]
    write_parquet(STEPS, pa.Table.from_arrays(columns, schema=schema), path / segment_name("steps", 1, PARQUET_SUFFIX))
    assert (path / segment_name("steps", 1, PARQUET_SUFFIX)).stat().st_size < rows
    other = rank_dir(tmp_path, 1)
    segments = StreamSegmentWriter(other, STEPS)
    segments.append([step_row(0), step_row(1)])
    segments.close()
    trace = load(tmp_path)
    assert trace.steps["rank"].tolist() == [1, 1]
    assert any("rows in" in s.reason and "more than a trace segment holds" in s.reason for s in trace.skipped)
