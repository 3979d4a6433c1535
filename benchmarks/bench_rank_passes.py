"""CPU per rank of each stage of the partitioned analysis's per-rank passes, serially in one process.

The cold ``diag analyze`` at 16,384 ranks spends ~13 ms of CPU per rank (docs/benchmarks.md); this splits the
per-rank part of it into its stages, each timed alone over the same ranks (``time.process_time``, best of
``--repeat``, the files in the page cache), so that a change to one stage is measured by itself:

- read: the rank's collectives as Arrow (the loader's narrow per-rank read), and its memory and telemetry;
- part: ``_part_of`` + ``_partial`` (pass 1's compact part and the rank's instance partials), then
  ``combine_partials`` of all of them;
- finish: ``finish_part`` (pass 2) then ``merge_sums`` of the results;
- tables: the memory and telemetry read and analysed by the analysis engine (``engine.Plan.first``), a batch of
  ranks at a time;
- then pass 1 as the engine runs it (``Collectives.first``, ``read_batch`` before it: a batch's reads, parts
  and combined partial).

Only functions that main and its branches share are called, so the same script measures any code tree: run it
from each checkout with that checkout first on the path::

    cd /work/main && PYTHONPATH=$PWD python3 /path/to/benchmarks/bench_rank_passes.py /tmp/scale2/s4096 --ranks 256

``--generate RANKS`` first writes a synthetic format-2 trace of RANKS ranks x 1,000 steps to TRACE_DIR when it
holds none (``python3 -m diag.testing.synthetic``), so that the suite can run it from nothing; the table is
``record.Table``'s (``--json PATH`` saves it).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Table, add_json_option  # noqa: E402
from synthetic_trace import generate_if_missing  # noqa: E402


def _window_and_bounds(trace):
    """The step window ``analyze`` chooses for the trace, and the ranks' telemetry windows in it."""
    from diag.analysis.report import analyze, telemetry_bounds_in_window

    class _Stop(Exception):
        pass

    captured = {}

    def capture(window, *_):
        captured.setdefault("window", window)
        raise _Stop

    with contextlib.suppress(_Stop):  # the window captured, nothing more of the analysis wanted
        analyze(trace, reduce_collectives=capture, run_ranks=capture)
    window = captured["window"]
    return window, telemetry_bounds_in_window(trace.steps, window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir")
    parser.add_argument("--ranks", type=int, default=256, help="the first RANKS ranks (default 256)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace_dir, args.generate)

    import diag.analysis.partitioned as P
    from diag.analysis import engine

    try:
        import diag.analysis.collective_waits as W
    except ImportError:  # a checkout before the collectives' own module
        W = P
    from diag.analysis.memory import MemoryAnalysis
    from diag.analysis.telemetry import TelemetryAnalysis

    trace = P.load_without_collectives(args.trace_dir, analysed_columns_only=True, without=P.RANK_TABLES)
    window, bounds = _window_and_bounds(trace)
    tasks = engine.rank_sources(trace, bounds)[: args.ranks]
    n = len(tasks)
    batch = engine.BATCH_RANKS
    plan = engine.Plan((TelemetryAnalysis({}), MemoryAnalysis(window)))

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        return min(times) * 1e3 / n

    def read_tables():
        return [engine.read_shard(tasks[i : i + batch], plan.columns()) for i in range(0, n, batch)]

    def read_collectives():
        return [W.read_rank_collectives(t)[0] for t in tasks]

    arrows = read_collectives()
    parts = [W._part_of(t, a, window) for t, a in zip(tasks, arrows)]
    partials = [W._partial(p) for p in parts]
    match = W.match_table(W.instance_table(W.combine_partials(*partials)))
    sums = [W.finish_part(p, match) for p in parts]

    def part_and_partial():
        for t, a in zip(tasks, arrows):
            W._partial(W._part_of(t, a, window))

    def read_and_map():
        for i in range(0, n, batch):
            plan.first(tasks[i : i + batch])

    stages = [
        ("read collectives (Arrow)", read_collectives),
        (f"read memory + telemetry (frames, {batch} ranks a batch)", read_tables),
        ("_part_of + _partial", part_and_partial),
        ("combine_partials", lambda: W.combine_partials(*partials)),
        ("finish_part", lambda: [W.finish_part(p, match) for p in parts]),
        ("merge_sums", lambda: W.merge_sums(*sums)),
        (f"memory + telemetry read and mapped ({batch} ranks a batch)", read_and_map),
    ]
    print(f"{P.__file__}: {n} ranks of {args.trace_dir}, CPU ms per rank (best of {args.repeat})")
    table = Table("rank_passes", ["stage", "CPU per rank (ms)"])
    total = 0.0
    for name, fn in stages:
        ms = best(fn)
        total += ms
        table.add(name, f"{ms:.3f}")
    table.add("total of the stages", f"{total:.3f}")
    # the passes as the engines run them: pass 1 a batch at a time (read, part, partials combined), pass 2
    batches = [tasks[i : i + batch] for i in range(0, n, batch)]
    first = W.Collectives(window).first
    table.add(f"pass 1 as run (read_batch, {batch} ranks)", f"{best(lambda: [first(b) for b in batches]):.3f}")
    table.note(f"the first {n:,} ranks of the trace; CPU time (time.process_time), best of {args.repeat}, serially "
               f"in one process, the files in the page cache")  # fmt: skip
    table.save(args.json)


if __name__ == "__main__":
    main()
