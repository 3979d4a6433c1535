"""Where one load of ``diag dashboard`` goes: cProfile of ``LiveTrace.refresh`` with the pages' aggregations
(``pages.prepare``), no triage. Prints wall and CPU time (this process, and its worker processes: the
partitioned analysis runs its passes in worker processes from 512 ranks, which cProfile does not see), the peak
RSS, where the report came from and the 45 costliest calls (cumulative).

    python benchmarks/profile_dashboard.py /tmp/dash16k/s1024 --no-cache [--out refresh.prof]

``--no-cache``: compute the report even when ``diag analyze`` cached one for these files (the cold load).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir")
    parser.add_argument("--out", help="write the profile here (for snakeviz, pstats)")
    parser.add_argument("--lines", type=int, default=45)
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the report cache")
    args = parser.parse_args()

    from diag.dashboard.data import LiveTrace
    from diag.dashboard.pages import prepare

    live = LiveTrace(args.trace_dir, poll_interval_s=3600, triage=False, cache=not args.no_cache)
    live.prepare = prepare
    profile = cProfile.Profile()
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    profile.enable()
    live.refresh()
    profile.disable()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"refresh: {time.perf_counter() - wall_started:.1f} s wall, {time.process_time() - cpu_started:.1f} s CPU "
        f"here + {children.ru_utime + children.ru_stime:.1f} s CPU in worker processes, peak RSS {peak_gb:.2f} GB "
        f"here ({children.ru_maxrss / 1e6:.2f} GB the largest worker), report "
        f"{getattr(live.snapshot, 'report_source', None) or 'computed'}"
    )
    if args.out:
        profile.dump_stats(args.out)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.lines)


if __name__ == "__main__":
    main()
