"""Triage of PyTorch's debug server's periodic dumps (diag/triage/debug_server.py): a real job's, and recorded ones."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import free_port, start_ranks
from diag.triage.debug_server import STACKS_RE, parse_stacks
from tests.triage.jobs import DEBUG_SERVER_JOB, diag_triage_json, end_debug_server_job


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


def _in_sleep(dump) -> bool:
    frames = [f["name"] for t in dump.threads.get(2, []) if t["main"] for f in t["frames"]]
    return dump.complete and "wait_for_slow_input" in frames


@pytest.mark.slow
def test_real_debug_server_dumps_name_the_missing_rank_and_where_it_sleeps(tmp_path):
    """A real gloo job with the debug server on: rank 2 sleeps before an all_reduce ranks 0 and 1 wait in. Then
    rank 2 is frozen (SIGSTOP), so the later dumps lack it: triage judges the latest complete dump and says so."""
    dump_dir, pid_file = tmp_path / "dumps", tmp_path / "frontend.pid"
    procs = start_ranks([str(DEBUG_SERVER_JOB), str(dump_dir), str(free_port())], 3, {"TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        complete = _wait_for(dump_dir, _in_sleep, 90, procs)
        assert complete is not None, [p.name for p in _stacks(dump_dir)]
        procs[2].send_signal(signal.SIGSTOP)  # frozen: its worker server answers no more, its peers keep waiting
        partial = _wait_for(dump_dir, lambda d: 2 in d.failed, 60, procs)
    finally:
        end_debug_server_job(procs, pid_file)
    verdict = diag_triage_json(dump_dir)
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [2]
    assert any("debug_server_job.py" in s and "wait_for_slow_input" in s for s in verdict["ranks"]["2"]["stack"])
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    assert partial is not None, [p.name for p in _stacks(dump_dir)]
    assert any(partial.name in e and "lacks ranks [2]" in e for e in verdict["evidence"]), verdict["evidence"]


def _pull_when(url: str, directory: Path, test, timeout_s: float, procs):
    """Pull until ``test`` accepts the stacks pulled (the frontend starts after the job's process group)."""
    from diag.triage.debug_pull import PullError, pull

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        try:
            pulled = pull(url, directory, timeout_s=30)
        except PullError:
            time.sleep(1)
            continue
        if test(parse_stacks(pulled.stacks_file)):
            return pulled
        pulled.stacks_file.unlink()
        time.sleep(1)
    return None


@pytest.mark.slow
def test_pull_from_a_running_job_names_the_missing_rank_now_and_profiles_it(tmp_path):
    """The same job, asked on demand: ``diag triage --pull URL DIR`` fetches every rank's stacks and Flight
    Recorder dumps from the frontend, saves them, and judges them; a profile of rank 2 comes from its worker."""
    from diag.triage.debug_pull import profile

    dump_dir, pid_file, now = tmp_path / "dumps", tmp_path / "frontend.pid", tmp_path / "now"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = start_ranks([str(DEBUG_SERVER_JOB), str(dump_dir), str(port)], 3, {"TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        ready = _pull_when(url, tmp_path / "probe", _in_sleep, 90, procs)
        assert ready is not None, "the debug server never showed rank 2 in wait_for_slow_input"
        result = subprocess.run(
            [sys.executable, "-m", "diag", "triage", "--pull", url, str(now), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        profiles = profile(url, [2], 1.0, tmp_path / "profiles")
    finally:
        end_debug_server_job(procs, pid_file)
    verdict = json.loads(result.stdout)
    assert result.returncode == 1, result.stderr
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [2], verdict["evidence"]
    assert any("wait_for_slow_input" in s for s in verdict["ranks"]["2"]["stack"])
    assert "pulled the stacks of 3 ranks" in result.stderr
    fr = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(now / "flight_recorder"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    from_dumps = json.loads(fr.stdout)
    assert from_dumps["verdict"] == "missing_ranks" and from_dumps["culprit_ranks"] == [2], from_dumps["evidence"]
    assert from_dumps["collective"]["op"] == "all_reduce"
    assert isinstance(profiles[2], Path), profiles
    assert "traceEvents" in json.loads(profiles[2].read_text())
