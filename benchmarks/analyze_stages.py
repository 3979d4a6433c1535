"""Where `diag analyze`'s partitioned path spends its time, stage by stage, in one process: wall and CPU time
(user + system, worker processes included once they are joined) of loading the per-step tables, the per-rank
passes (collectives, memory and telemetry), each analysis of the report and rendering the JSON; the peak RSS
of this process. ``--profile OUT``: everything run serially (threads replaced by a loop, no worker processes)
under cProfile, OUT the stats file (``python -m pstats OUT``).

    python benchmarks/analyze_stages.py /tmp/cold16k/s1024
    python benchmarks/analyze_stages.py /tmp/cold16k/s1024 --profile /tmp/cold16k/p.prof
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import time
from concurrent.futures import Executor, Future

import diag.analysis.partitioned as P
import diag.analysis.report as R
import diag.processes as processes
import diag.trace.loader as L

STAGES = ("find_failures", "choose_window", "select", "rank_step_times", "analyze_comms", "find_stragglers",
          "analyze_mfu", "analyze_links", "_run_info", "_timeline")  # fmt: skip


class Serial(Executor):
    def map(self, fn, *iterables, **_):
        return map(fn, *iterables)

    def submit(self, fn, *args, **kwargs):
        done = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Timed:
    """A callable (or a reducer with attributes) that adds its wall and CPU time to ``marks``."""

    def __init__(self, name, fn, marks):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_marks", marks)

    def __call__(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), cpu_s()
        result = self._fn(*args, **kwargs)
        self._marks.append((self._name, time.perf_counter() - wall, cpu_s() - cpu))
        return result

    def __getattr__(self, name):
        return getattr(self._fn, name)

    def __setattr__(self, name, value):
        setattr(self._fn, name, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir")
    parser.add_argument("--profile", metavar="OUT")
    args = parser.parse_args()
    marks: list = []
    if args.profile:
        P.ThreadPoolExecutor = L.ThreadPoolExecutor = lambda *a, **k: Serial()
        processes.PROCESS_MIN_RANKS = 1 << 62  # profiled in this process: no worker processes
    # from 512 ranks the worker processes load them, through the same function (workers=)
    P.load_without_collectives = Timed("load the per-step tables", P.load_without_collectives, marks)
    for name in STAGES:
        setattr(R, name, Timed(name, getattr(R, name), marks))
    reducers = P.collectives_reducer, P.rank_tables_runner
    P.collectives_reducer = lambda *a, **k: Timed("per-rank passes (collectives)", reducers[0](*a, **k), marks)
    P.rank_tables_runner = lambda *a, **k: Timed("per-rank analyses (engine)", reducers[1](*a, **k), marks)
    profile = cProfile.Profile() if args.profile else None
    wall, cpu = time.perf_counter(), cpu_s()
    if profile:
        profile.enable()
    report = P.analyze_partitioned(args.trace_dir)
    from diag.views import render

    Timed("render JSON", render, marks)(report, "json")
    if profile:
        profile.disable()
        profile.dump_stats(args.profile)
    print("| stage | wall | CPU |\n|---|---|---|")
    for name, w, c in marks:
        print(f"| {name} | {w:.2f} s | {c:.2f} s |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"| **whole** | {time.perf_counter() - wall:.2f} s | {cpu_s() - cpu:.2f} s (peak RSS {peak:.2f} GB) |")


if __name__ == "__main__":
    main()
