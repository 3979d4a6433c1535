"""Triage of PyTorch's debug server's periodic dumps (diag/triage/debug_server.py): a real job's, and recorded ones."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import free_port, start_ranks
from diag.trace.loader import TraceError
from diag.triage.analysis import triage
from diag.triage.debug_server import STACKS_RE, parse_stacks
from diag.triage.sources import read_input

JOB = Path(__file__).with_name("debug_server_job.py")
PARTIAL = "stacks_20261128_162021.txt"  # rank 2 frozen: "PARTIAL DATA: 2/3", rank 2 timed out
FIXTURES = Path(__file__).parents[1] / "fixtures" / "debug_server"
COMPLETE = "stacks_20261128_162012.txt"  # every rank answered; rank 2 in wait_for_slow_input


def _stacks(dump_dir: Path) -> list[Path]:
    return sorted(p for p in dump_dir.iterdir() if STACKS_RE.match(p.name)) if dump_dir.is_dir() else []


def _wait_for(dump_dir: Path, test, timeout_s: float, procs) -> Path | None:
    """The first new stacks dump ``test`` accepts, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    seen: set[Path] = set()
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        for path in _stacks(dump_dir):
            if path in seen:
                continue
            seen.add(path)
            try:
                if test(parse_stacks(path)):
                    return path
            except (OSError, ValueError):
                seen.discard(path)  # being written: read it again
        time.sleep(0.5)
    return None


def _end(procs, pid_file: Path) -> None:
    if pid_file.exists():  # the frontend is a daemon of rank 0, but rank 0's SIGKILL leaves it running
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _in_sleep(dump) -> bool:
    frames = [f["name"] for t in dump.threads.get(2, []) if t["main"] for f in t["frames"]]
    return dump.complete and "wait_for_slow_input" in frames


@pytest.mark.slow
def test_real_debug_server_dumps_name_the_missing_rank_and_where_it_sleeps(tmp_path):
    """A real gloo job with the debug server on: rank 2 sleeps before an all_reduce ranks 0 and 1 wait in. Then
    rank 2 is frozen (SIGSTOP), so the later dumps lack it: triage judges the latest complete dump and says so."""
    dump_dir, pid_file = tmp_path / "dumps", tmp_path / "frontend.pid"
    procs = start_ranks([str(JOB), str(dump_dir), str(free_port())], 3, {"TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        complete = _wait_for(dump_dir, _in_sleep, 90, procs)
        assert complete is not None, [p.name for p in _stacks(dump_dir)]
        procs[2].send_signal(signal.SIGSTOP)  # frozen: its worker server answers no more, its peers keep waiting
        partial = _wait_for(dump_dir, lambda d: 2 in d.failed, 60, procs)
    finally:
        _end(procs, pid_file)
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(dump_dir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [2]
    assert any("debug_server_job.py" in s and "wait_for_slow_input" in s for s in verdict["ranks"]["2"]["stack"])
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    assert partial is not None, [p.name for p in _stacks(dump_dir)]
    assert any(partial.name in e and "lacks ranks [2]" in e for e in verdict["evidence"]), verdict["evidence"]


def _copy(tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "dumps"
    out.mkdir()
    for name in names:
        shutil.copy(FIXTURES / name, out / name)
    return out


def test_recorded_dump_names_rank_2_and_its_sleeping_function(tmp_path):
    data = read_input(_copy(tmp_path, COMPLETE))
    result = triage(data)
    assert (result.verdict, result.culprit_ranks) == ("missing_ranks", [2]), result.evidence
    assert result.ranks[2].stack[-1].endswith("in wait_for_slow_input")
    assert result.ranks[2].state == "stuck_in_compute"


def test_rank_missing_from_the_latest_dump_falls_back_to_the_latest_complete_one(tmp_path):
    partial = PARTIAL
    data = read_input(_copy(tmp_path, COMPLETE, partial))
    assert any(COMPLETE in n and partial in n and "lacks ranks [2]" in n for n in data.notes), data.notes
    assert (triage(data).culprit_ranks) == [2]


def test_partial_dump_alone_treats_the_silent_rank_as_one_without_a_dump(tmp_path):
    partial = PARTIAL
    data = read_input(_copy(tmp_path, partial))
    assert data.ranks[2].has_data is False
    assert any("did not answer" in n and "rank 2" in n for n in data.notes), data.notes
    assert data.ranks[0].last_dump is not None


def test_corrupt_latest_dump_is_skipped_with_its_reason(tmp_path):
    out = _copy(tmp_path, COMPLETE)
    (out / "stacks_20261128_235959.txt").write_bytes(b"\x00\xff garbage, no rank sections\n")
    data = read_input(out)
    assert [Path(s.path).name for s in data.skipped] == ["stacks_20261128_235959.txt"]
    assert "no '=== Rank N" in data.skipped[0].reason
    assert triage(data).culprit_ranks == [2]


def test_only_corrupt_dumps_give_a_clear_error(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    (out / "stacks_20261128_235959.txt").write_text("not a dump\n")
    with pytest.raises(TraceError, match="no readable stacks dump"):
        read_input(out)


def test_empty_directory_gives_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="neither a diag trace"):
        read_input(tmp_path)
