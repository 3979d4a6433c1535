"""Columns added to the end of a table (the memory categories, NVML's per-process memory) leave files written
before them readable: their rows read with the new columns empty, in one load and in a live view's polls."""

from __future__ import annotations

import shutil

import diag
from diag.trace.loader import TraceReader
from diag.trace.schema import MEMORY, TELEMETRY
from tests.conftest import REPO

ADDED = ("param_bytes", "grad_bytes", "optimizer_state_bytes", "categories_step")


def test_sample_runs_written_before_the_new_columns_still_read():
    trace = diag.load(REPO / "sample_traces" / "straggler")
    assert not trace.skipped
    assert len(trace.memory) and trace.memory[list(ADDED)].isna().all().all()
    assert trace.memory["rss_bytes"].notna().all()
    assert "process_mem_used_bytes" in trace.telemetry


def test_an_older_file_is_read_incrementally_with_the_new_columns_empty(tmp_path):
    rank_dir = tmp_path / "rank00000"
    shutil.copytree(REPO / "sample_traces" / "straggler" / "rank00000", rank_dir)
    path = rank_dir / MEMORY.file_name
    lines = path.read_text().splitlines(keepends=True)
    assert lines[1].strip().split(",") == MEMORY.column_names[: -len(ADDED)]  # an older header
    path.write_text("".join(lines[:5]))
    reader = TraceReader(tmp_path, tables=("memory",))
    first = reader.poll()["memory"]
    with open(path, "a") as handle:
        handle.writelines(lines[5:8])
    second = reader.poll()["memory"]
    assert (len(first), len(second)) == (3, 3) and not reader.poll()["skipped"]
    assert second[list(ADDED)].isna().all().all() and second["step"].tolist() == [3, 4, 5]


def test_a_header_missing_a_required_column_is_still_refused(tmp_path):
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    names = TELEMETRY.column_names[:1]  # time_us alone: gpu (required) is missing
    (rank_dir / TELEMETRY.file_name).write_text(TELEMETRY.marker_line() + ",".join(names) + "\n1\n")
    reader = TraceReader(tmp_path, tables=("telemetry",))
    result = reader.poll()
    assert result["telemetry"].empty
    assert any("header does not match" in s.reason for s in result["skipped"])
    assert not MEMORY.header_columns(["time_us", "step"])  # names out of order are not a leading part
