"""One command run as its own process, with its wall time, CPU time and peak RSS (os.wait4).

os.wait4's peak RSS is the largest of the process and its children, not their sum: a command that works in
worker processes (diag analyze's Workers pool) is also given ``tree_peak_gb``, the largest sum of the
proportional set sizes (PSS: a page shared by n processes counts 1/n in each) of the process and all its
descendants, sampled every 0.2 s from /proc (Linux; 0 elsewhere). CPU time from os.wait4 includes the
children's (they are waited for).

CPU time (user + system, all threads) is given too because wall time on a shared machine depends on what else
runs. A child starts with the pages of the process it was forked from, and its peak RSS counts them: keep the
benchmark's own process small (parse large outputs in a child of their own).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    peak_rss_gb: float
    stdout: str
    stderr: str
    tree_peak_gb: float = 0.0  # largest summed PSS of the process and its descendants, sampled (see above)


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from each process's parent in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _TreeSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, sum(_pss_bytes(p) for p in _descendants(self.pid)))


def run_measured(argv: list[str], cwd: Path | str | None = None) -> Measured:
    """Run ``argv`` (in ``cwd``: ``python -m`` imports the working directory's packages before PYTHONPATH's);
    exit with its error output if it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd)
        sampler = _TreeSampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start
        sampler.stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:4])} failed with {proc.returncode}:\n{stderr[-2000:]}")
    # ru_maxrss is in KiB on Linux
    return Measured(wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1e6, stdout, stderr, sampler.peak / 1e9)
