"""Small jobs exercising the watchdog's signal and failure paths. ``python watchdog_job.py CASE TRACE_DIR``.

blocked_sigterm  2 gloo ranks; rank 0 blocks in an all_reduce rank 1 never joins (60 s timeout), so its
                 main thread sits in C++ where Python signal handlers cannot run; the test SIGTERMs it
sigusr1          1 process; sends itself SIGUSR1 mid-step, then finishes normally
broken_session   1 process; the session's pending_collectives raises: the watchdog must warn once, keep
                 the heartbeat going, and the loop must finish
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

import diag


def blocked_sigterm(trace_dir: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    diag.init(trace_dir, telemetry=False, hang_threshold_s=30, heartbeat_interval_s=0.2)
    with diag.step():
        if dist.get_rank() == 0:
            (Path(trace_dir) / "blocked").write_text(str(os.getpid()))
            dist.all_reduce(torch.ones(4))
        else:
            time.sleep(60)


def sigusr1(trace_dir: str) -> None:
    diag.init(trace_dir, telemetry=False, hang_threshold_s=30, heartbeat_interval_s=0.2)
    with diag.step(), diag.phase("forward"):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.5)
    diag.finish()
    print("finished", flush=True)


def fork_sigterm(trace_dir: str) -> None:
    diag.init(trace_dir, telemetry=False, hang_threshold_s=30, heartbeat_interval_s=0.2)
    with diag.step():
        child = os.fork()
        if child == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(3)  # not reached: SIGTERM must still end the child
        _, status = os.waitpid(child, 0)
        time.sleep(3)  # longer than the watchdog's SIGTERM grace: the parent must survive it
    diag.finish()
    print("child signal:", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)


def sleep(trace_dir: str) -> None:
    diag.init(trace_dir, telemetry=False, hang_threshold_s=30, heartbeat_interval_s=0.2)
    with diag.step(), diag.phase("forward"):
        (Path(trace_dir) / "sleeping").write_text(str(os.getpid()))
        time.sleep(60)


def broken_session(trace_dir: str) -> None:
    session = diag.init(trace_dir, telemetry=False, hang_threshold_s=30, heartbeat_interval_s=0.1)

    def broken():
        raise RuntimeError("broken on purpose")

    session.pending_collectives = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            with diag.step():
                time.sleep(0.05)
        diag.finish()
    print("warnings:", sum("cannot read pending collectives" in str(w.message) for w in caught), flush=True)


if __name__ == "__main__":
    {
        "blocked_sigterm": blocked_sigterm,
        "sigusr1": sigusr1,
        "fork_sigterm": fork_sigterm,
        "sleep": sleep,
        "broken_session": broken_session,
    }[sys.argv[1]](sys.argv[2])
