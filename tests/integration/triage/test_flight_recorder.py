"""The restricted Flight Recorder loader: real NCCL and gloo dumps load, hostile or broken files are rejected."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from diag.trace.loader import TraceError
from diag.triage.flight_recorder import DumpRejected, load_dump
from diag.triage.sources import read_fr_dir

NCCL_PICKLE = "flight_recorder_h100_nccl_rank0.pkl"


class RunsShell:
    """Unpickling this with plain pickle.loads runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_would_run_code_is_rejected_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    dump_dir = tmp_path / "dumps"
    dump_dir.mkdir()
    hostile = {"version": "2.10", "pg_config": {}, "entries": [{"frames": RunsShell(marker)}]}
    (dump_dir / "nccl_trace_rank_0").write_bytes(pickle.dumps(hostile))
    with pytest.raises(DumpRejected, match="refused to load posix.system"):
        load_dump(dump_dir / "nccl_trace_rank_0")
    with pytest.raises(TraceError, match="rejected pickle: refused to load posix.system"):
        read_fr_dir(dump_dir)  # the command's error names the file and why
    assert not marker.exists()
    # the same bytes do run code when unpickled without restriction: the test is not vacuous
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import pickle; pickle.loads(open({str(dump_dir / 'nccl_trace_rank_0')!r}, 'rb').read())",
        ],
        check=True,
    )
    assert marker.exists()


def test_real_nccl_dump_directory_is_triaged_without_torchs_analyser(gpu_fixtures, tmp_path):
    """The H100 NCCL dump (842 completed entries), named as TORCH_NCCL_DEBUG_INFO_TEMP_FILE names dumps."""
    (tmp_path / "nccl_trace_rank_0").write_bytes((gpu_fixtures / NCCL_PICKLE).read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(tmp_path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "no_problem" and verdict["skipped"] == []
    assert verdict["ranks"]["0"]["state"] == "all_collectives_done"
    assert verdict["ranks"]["0"]["detail"].startswith("last collective issued: broadcast seq 842 in group 0")
