"""What `diag analyze`'s partitioned path does on its main process besides waiting for the per-rank passes, for
the code on PYTHONPATH (run it once per tree, from that tree's directory): loading the per-step tables, on this
process (``load_without_collectives``) and in two worker processes (the same, given a ``Workers`` pool), then
the analyses after the passes on the steps table (choose_window, select, rank_step_times, find_stragglers and
its findings, MFU, the timeline), each timed in wall and CPU time (this process's user + system: the steadier
figure on a shared machine; the workers' load is wall only).

    cd /work/main && PYTHONPATH=/work/main python /path/to/benchmarks/bench_serial_stages.py /tmp/scale2/s4096
    PYTHONPATH=. python benchmarks/bench_serial_stages.py /tmp/scale2/s4096

The analyses run without the collectives' waits (the steps' own comm_wait_us), so rank_step_times does not
align them: the rest is what analyze runs.

``--generate RANKS`` first writes a synthetic format-2 trace of RANKS ranks x 1,000 steps to TRACE_DIR when it
holds none (``python3 -m diag.testing.synthetic``), so that the suite can run it from nothing; the table is
``record.Table``'s (``--json PATH`` saves it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Table, add_json_option  # noqa: E402
from synthetic_trace import generate_if_missing  # noqa: E402


def timed(rows: list, name: str, fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    rows.append((name, time.perf_counter() - wall, time.process_time() - cpu))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir")
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace_dir, args.generate)

    import diag.analysis.partitioned as P
    from diag.analysis import report as R
    from diag.analysis import stragglers as S
    from diag.analysis.findings import FindingContext
    from diag.analysis.mfu import analyze_mfu
    from diag.analysis.window import choose_window, select

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; diag from {P.__file__}")
    rows: list = []
    trace = timed(rows, "load, this process (threads)", P.load_without_collectives, args.trace_dir,
                  analysed_columns_only=True, without=P.RANK_TABLES)  # fmt: skip
    from diag.processes import Workers

    del trace
    with Workers(2) as workers:
        trace = timed(rows, "load, 2 worker processes", P.load_without_collectives, args.trace_dir,
                      analysed_columns_only=True, without=P.RANK_TABLES, workers=workers)  # fmt: skip
    loads = len(rows)
    window = timed(rows, "choose_window", choose_window, trace.steps, None, [])
    steps_w = timed(rows, "select", select, trace.steps, window)
    times = timed(rows, "rank_step_times", S.rank_step_times, steps_w, None, None)
    info = R._ranks_info(trace)
    found = timed(rows, "find_stragglers", S.find_stragglers, times, info, {}, {}, {})
    ctx = FindingContext(1.0, window.steps_analysed, times, found)
    timed(rows, "straggler_findings", S.straggler_findings, found, ctx)
    timed(rows, "analyze_mfu", analyze_mfu, times.frame, trace.manifests, steps_w, None, None, 1)
    timed(rows, "_timeline", R._timeline, times.frame, {})
    table = Table("serial_stages", ["stage", "wall (s)", "CPU, this process (s)"])
    for name, wall, cpu in rows:
        table.add(name, f"{wall:.2f}", f"{cpu:.2f}")
    after = rows[loads:]
    table.add("**analyses after the passes**", f"{sum(r[1] for r in after):.2f}", f"{sum(r[2] for r in after):.2f}")
    ranks = len(list(Path(args.trace_dir).glob("rank[0-9]*")))
    table.note(f"{ranks:,} ranks, {len(trace.steps):,} steps rows; {trace.steps['step'].nunique():,} steps")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    table.save(args.json)


if __name__ == "__main__":
    main()
