"""Run ``hang_job.py`` scenarios as real multi-process gloo jobs, bounded in time, and collect their traces."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from diag.launch import start_ranks
from diag.triage.watch import PROBLEM_VERDICTS

HANG_JOB = Path(__file__).with_name("hang_job.py")
DEBUG_SERVER_JOB = Path(__file__).with_name("debug_server_job.py")
WORLD_SIZE = 3
BAD_RANK = 1
JOB_DEADLINE_S = 120  # the longest any scenario may run before every rank is killed (a loaded box starts ranks late)
PG_TIMEOUT_S = 8
HANG_THRESHOLD_S = 2
FR_PREFIX = "fr_trace_"


def run_scenario(scenario: str, out_dir: Path, world_size: int = WORLD_SIZE) -> Path:
    """Run one scenario to its end and return the trace directory; no process outlives this call."""
    trace_dir = out_dir / "trace"
    master_port, second_port = distinct_free_ports(2)
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "HANG_JOB_PG_TIMEOUT_S": str(PG_TIMEOUT_S),
        "HANG_JOB_THRESHOLD_S": str(HANG_THRESHOLD_S),
        "MASTER_PORT": str(master_port),
        "HANG_JOB_SECOND_PORT": str(second_port),  # the regroup scenario's second default group
    }
    procs = start_ranks([str(HANG_JOB), scenario, str(trace_dir)], world_size, env)
    try:
        _drive(scenario, procs, trace_dir)
    finally:
        _end_all(procs)
    return trace_dir


def distinct_free_ports(count: int) -> list[int]:
    """Ports free now and different from each other: each bound until all are chosen (ports chosen one at a
    time can repeat, and a job whose two stores share a port fails to re-initialise)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drive(scenario: str, procs: list[subprocess.Popen], trace_dir: Path) -> None:
    deadline = time.monotonic() + JOB_DEADLINE_S
    bad = procs[BAD_RANK]
    first_stall = None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if scenario == "kill" and bad.poll() is None and (trace_dir / "ready_to_kill").exists():
            time.sleep(0.3)  # let it sit in the step a moment, as a real crash would hit a running rank
            bad.send_signal(signal.SIGKILL)
        if first_stall is None and any(_has_stall_dump(trace_dir, r) for r in range(len(procs))):
            first_stall = time.monotonic()
        if first_stall is not None and time.monotonic() > first_stall + PG_TIMEOUT_S + 3:
            for proc in procs:  # past the timeout: what a launcher does to the survivors of a failed job
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.2)


def _has_stall_dump(trace_dir: Path, rank: int) -> bool:
    return any((trace_dir / f"rank{rank:05d}").glob("hang_dump_*.json"))


def _end_all(procs: list[subprocess.Popen]) -> None:
    grace_end = time.monotonic() + 10  # a rank just sent SIGTERM is writing its dump
    while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def end_debug_server_job(procs: list[subprocess.Popen], pid_file: Path) -> None:
    """Kill ``debug_server_job.py``'s ranks and the debug server's frontend, whose process id it wrote to
    ``pid_file``: the frontend is a daemon of rank 0, but rank 0's SIGKILL leaves it running."""
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def collect_fr_dumps(trace_dir: Path, fr_dir: Path) -> list[int]:
    """Copy each rank's Flight Recorder dump to ``fr_dir/fr_trace_<rank>``, as TORCH_FR_DUMP_TEMP_FILE names
    them; returns the ranks that had one."""
    fr_dir.mkdir(parents=True, exist_ok=True)
    ranks = []
    for rank_dir in sorted(trace_dir.glob("rank*")):
        dump = rank_dir / "fr_dump.pkl"
        if dump.exists():
            rank = int(rank_dir.name[len("rank") :])
            shutil.copyfile(dump, fr_dir / f"{FR_PREFIX}{rank}")
            ranks.append(rank)
    return ranks


def diag_triage_json(path: Path) -> dict:
    import json

    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode in (0, 1), result.stderr  # 1: a problem found
    verdict = json.loads(result.stdout)
    assert result.returncode == (1 if verdict["verdict"] in PROBLEM_VERDICTS else 0), verdict["verdict"]
    return verdict
