"""Schema version 2 under a real SIGKILL: a live reader polls a running job's Arrow stream segments, sees every
step once, in order, while they are written; the kill loses at most about a second and damages nothing."""

import os
import signal
import subprocess
import sys
import time

import diag
from diag.trace.loader import TraceReader
from tests.conftest import JOBS

FLUSH_INTERVAL_S = 0.1  # many small record batches: many chances for a poll to meet one half-written


def test_live_reader_and_sigkill_on_columnar_segments(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "kill_job.py"), str(tmp_path), str(FLUSH_INTERVAL_S), "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    printed = []
    polled: list[int] = []
    polls_with_rows = 0
    reader = None
    deadline = time.time() + 60
    while time.time() < deadline:
        printed.append(proc.stdout.readline().split())
        if reader is None and (tmp_path / "rank00000").exists():
            reader = TraceReader(tmp_path)
        if reader is not None and len(printed) % 5 == 0:  # every ~100 ms, as a dashboard polls
            new = reader.poll()
            assert new["skipped"] == []
            polled += new["steps"]["step"].tolist()
            polls_with_rows += bool(len(new["steps"]))
        if int(printed[-1][0]) >= 80:
            break
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.time()
    proc.wait()
    # the job may have run ahead of this loop (a loaded machine): the steps it printed that were not read yet
    printed += [line.split() for line in proc.stdout.read().splitlines()]
    assert polls_with_rows >= 5  # read while written, batch by batch
    last = reader.poll()
    assert last["skipped"] == []
    polled += last["steps"]["step"].tolist()
    assert polled == list(range(len(polled)))  # each step once, in order, across polls
    assert sorted(p.name for p in (tmp_path / "rank00000").glob("steps*")) == ["steps.000001.arrows"]
    trace = diag.load(tmp_path)
    assert trace.skipped == [] and trace.steps["step"].tolist() == polled
    last_recorded = polled[-1]
    assert killed_at - float(printed[last_recorded][1]) <= 1.0 + 0.2
