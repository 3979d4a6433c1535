"""Start the ranks of a small CPU job as plain processes with a gloo rendezvous (what torchrun does,
without its agent): used by ``diag demo``, the tests and the benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: still running when the caller gave up and it was killed
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ranks(argv: list[str], world_size: int, env: dict | None = None) -> list[subprocess.Popen]:
    """Start ``python argv...`` once per rank with RANK, WORLD_SIZE, LOCAL_RANK and a free MASTER_PORT."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def run_ranks(argv: list[str], world_size: int, env: dict | None = None, timeout_s: float = 120) -> list[RankResult]:
    """Run a job to its end (killing every rank after ``timeout_s``) and return each rank's outcome."""
    procs = start_ranks(argv, world_size, env)
    results = []
    for rank, proc in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
            results.append(RankResult(rank, proc.returncode, stdout, stderr))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            stdout, stderr = proc.communicate()
            results.append(RankResult(rank, None, stdout, stderr))
    return results
