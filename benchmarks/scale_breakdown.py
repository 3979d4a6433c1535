"""Where `diag analyze`'s memory goes: per table of the loaded trace (pandas ``memory_usage(deep=True)``) and per
analysis of ``diag.analysis.report.analyze`` (tracemalloc: bytes held after the stage and the stage's peak above
what was held before it), with the process RSS after loading. Run on a trace directory, e.g. one written by
``diag.testing.synthetic``:

    python3 -m diag.testing.synthetic /tmp/s1024 --ranks 1024 --steps 1000
    python benchmarks/scale_breakdown.py /tmp/s1024

The stages repeat ``analyze``'s own calls in its order (a stage's inputs are the previous stages' results), so
the figures are the real path's, not a model of it.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc
from pathlib import Path

from diag.analysis import report as rep
from diag.analysis.collective_waits import loaded_waits
from diag.analysis.comms import analyze_comms
from diag.analysis.engine import Shard, run_loaded, window_us_of
from diag.analysis.failures import find_failures
from diag.analysis.links import analyze_links
from diag.analysis.memory import MemoryAnalysis
from diag.analysis.mfu import analyze_mfu
from diag.analysis.stragglers import find_stragglers, rank_step_times
from diag.analysis.telemetry import TelemetryAnalysis
from diag.analysis.window import choose_window, select
from diag.trace.loader import load
from diag.trace.schema import TABLES


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1e9


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class Stages:
    def __init__(self):
        self.rows = []

    def run(self, name: str, fn):
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
        after, peak = tracemalloc.get_traced_memory()
        self.rows.append((name, seconds, (after - before) / 1e9, (peak - before) / 1e9))
        return result


def partitioned_breakdown(trace_dir: Path) -> None:
    """RSS after loading every table but the collectives, then after each stage of the partitioned analysis."""
    from diag.analysis.partitioned import (
        RANK_TABLES,
        collectives_reducer,
        load_without_collectives,
        rank_tables_runner,
    )

    base = rss_gb()
    start = time.perf_counter()
    trace = load_without_collectives(trace_dir, analysed_columns_only=True, without=RANK_TABLES)
    print(
        f"load without collectives: {time.perf_counter() - start:.1f} s, RSS {rss_gb():.2f} GB (+{rss_gb() - base:.2f})"
    )
    for name in TABLES:
        frame = getattr(trace, name)
        if len(frame):
            size = int(frame.memory_usage(deep=True).sum())
            print(
                f"  {name}: {len(frame):,} rows x {frame.shape[1]} columns, {size / 1e9:.3f} GB ({size / len(frame):.0f} B/row)"
            )
    tables = sum(int(getattr(trace, n).memory_usage(deep=True).sum()) for n in TABLES)
    print(f"tables in pandas: {tables / 1e9:.3f} GB")
    reduce = collectives_reducer(trace)
    window = choose_window(trace.steps, None, [])
    start = time.perf_counter()
    waits = reduce(window)
    print(
        f"both passes: {time.perf_counter() - start:.1f} s, RSS {rss_gb():.2f} GB, peak RSS {peak_rss_gb():.2f} GB; "
        f"per (rank, step) waits {waits.per_rank_step.memory_usage(deep=True) / 1e9:.3f} GB, "
        f"{len(waits.instances):,} instances"
    )
    start = time.perf_counter()
    tracemalloc.start()
    held, _ = tracemalloc.get_traced_memory()
    rep.analyze(trace, reduce_collectives=lambda _: waits, run_ranks=rank_tables_runner(trace))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"the analyses, memory and telemetry read and reduced by batch: {time.perf_counter() - start:.1f} s (under tracemalloc), their peak {(peak - held) / 1e9:.3f} GB "
        f"above what was held; process peak RSS {peak_rss_gb():.2f} GB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument(
        "--partitioned", action="store_true", help="the new path: tables without collectives, then the reduction"
    )
    args = parser.parse_args()
    if args.partitioned:
        partitioned_breakdown(args.trace_dir)
        return
    base = rss_gb()
    start = time.perf_counter()
    trace = load(args.trace_dir)
    load_s = time.perf_counter() - start
    print(f"load: {load_s:.1f} s, RSS {rss_gb():.2f} GB (+{rss_gb() - base:.2f}), peak RSS {peak_rss_gb():.2f} GB")
    print("\n| table | rows | columns | pandas memory (deep) | bytes/row |\n|---|---|---|---|---|")
    total = 0
    for name in (*TABLES, "events", "heartbeats"):
        frame = getattr(trace, name)
        size = int(frame.memory_usage(deep=True).sum())
        total += size
        per_row = f"{size / len(frame):.0f}" if len(frame) else "-"
        print(f"| {name} | {len(frame):,} | {frame.shape[1]} | {size / 1e9:.3f} GB | {per_row} |")
    print(f"| all tables | | | {total / 1e9:.3f} GB | |")

    tracemalloc.start()
    s = Stages()
    failures = s.run(
        "failures", lambda: find_failures(trace.events, trace.heartbeats, trace.manifests, trace.clock_offsets_us())
    )
    window = s.run("window", lambda: choose_window(trace.steps, None, failures.failed_steps))
    steps_w = s.run("select steps", lambda: select(trace.steps, window))
    ranks_info = rep._ranks_info(trace)
    hosts = ranks_info["host"].dropna().astype(str).to_dict() if "host" in ranks_info else {}
    waits = s.run(
        "loaded_waits (match across ranks)",
        lambda: loaded_waits(trace.collectives, window, trace.clock_offsets_us()),
    )
    times = s.run("rank_step_times", lambda: rank_step_times(steps_w, waits.per_rank_step, rep._pipeline_stages(trace)))
    comms = s.run("analyze_comms", lambda: analyze_comms(waits, steps_w, rep._pg_sizes(trace)))
    loaded = Shard({"memory": trace.memory, "telemetry": trace.telemetry}, window_us_of(rep.telemetry_bounds(steps_w)))
    s.run("telemetry in window", loaded.telemetry_in_window)
    telemetry = s.run("telemetry (engine)", lambda: run_loaded([TelemetryAnalysis(hosts)], loaded)[0])
    s.run("memory (engine)", lambda: run_loaded([MemoryAnalysis(window)], loaded)[0])
    throttled = {g.rank: g.throttled_share for g in telemetry.gpus if g.throttled}
    last = {r.rank: r.last_arrival_fraction for r in comms.per_rank}
    s.run("find_stragglers", lambda: find_stragglers(times, ranks_info, throttled, last, {}))
    s.run(
        "analyze_mfu",
        lambda: analyze_mfu(times.frame, trace.manifests, steps_w, None, None, rep.ranks_sharing_tokens(trace)),
    )
    s.run("analyze_links", lambda: analyze_links(waits, rep._pg_ranks(trace), hosts))
    s.run("timeline", lambda: rep._timeline(times.frame, hosts))
    print(
        f"\nwaits: {len(waits):,} rows, per (rank, step) {waits.per_rank_step.memory_usage(deep=True) / 1e9:.3f} GB, "
        f"{len(waits.instances):,} instances"
    )
    print("\n| stage | time | held after (tracemalloc) | peak above before |\n|---|---|---|---|")
    for name, seconds, held, peak in s.rows:
        print(f"| {name} | {seconds:.2f} s | {held:+.3f} GB | {peak:.3f} GB |")
    tracemalloc.stop()
    whole = time.perf_counter()
    rep.analyze(trace)
    print(
        f"\nwhole analyze (no tracemalloc): {time.perf_counter() - whole:.1f} s; process peak RSS {peak_rss_gb():.2f} GB"
    )


if __name__ == "__main__":
    main()
