"""One command run as its own process, with its wall time, CPU time and peak RSS (os.wait4).

CPU time (user + system, all threads) is given too because wall time on a shared machine depends on what else
runs. A child starts with the pages of the process it was forked from, and its peak RSS counts them: keep the
benchmark's own process small (parse large outputs in a child of their own).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    peak_rss_gb: float
    stdout: str
    stderr: str


def run_measured(argv: list[str]) -> Measured:
    """Run ``argv``; exit with its error output if it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:4])} failed with {proc.returncode}:\n{stderr[-2000:]}")
    # ru_maxrss is in KiB on Linux
    return Measured(wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1e6, stdout, stderr)
