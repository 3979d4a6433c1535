"""Crafted, tiny or hostile Flight Recorder dumps are refused in bounded time and never run code; FIFOs and
devices under a dump's or a trace file's name never hang triage (issue 12 items 4 and 8)."""

import os
import subprocess
import sys

import pytest

SELF_LIST = b"\x80\x02]q\x00h\x00a."  # a list that contains itself


@pytest.mark.parametrize("name", ["nccl_trace_rank_0", "rank00000/fr_dump.pkl"])
def test_triage_on_self_referencing_dump_finishes(tmp_path, name):
    """End to end in a subprocess with a timeout: before, this hung forever."""
    if "/" in name:
        (tmp_path / "rank00000").mkdir()
        (tmp_path / "rank00000" / "manifest.json").write_text('{"rank": 0, "world_size": 1, "run_id": "r"}')
    (tmp_path / name).write_bytes(SELF_LIST)
    result = subprocess.run(
        [sys.executable, "-m", "diag.cli", "triage", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1, 2) and "cycle" in (result.stdout + result.stderr)


def test_fifo_and_device_in_a_trace_do_not_hang_triage(tmp_path):
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    os.mkfifo(rank_dir / "manifest.json")
    os.mkfifo(rank_dir / "heartbeat.json")
    os.symlink("/dev/zero", rank_dir / "steps.csv")
    os.mkfifo(rank_dir / "fatal_stacks.txt")
    os.mkfifo(rank_dir / "fr_dump.pkl")
    (rank_dir / "collectives.csv").write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "diag.cli", "triage", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert "not a regular file" in result.stdout + result.stderr
