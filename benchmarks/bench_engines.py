"""The partitioned analysis of one trace on the engine's executors: inline (``workers=1``) and in two worker
processes (``workers=2``, the default from diag.processes.PROCESS_MIN_RANKS ranks on two cores), alternated, each
run its own process (benchmarks/measured.py): wall, CPU (worker processes included), largest process's peak RSS,
and the peak summed PSS of the process tree.

    python benchmarks/bench_engines.py /tmp/cold16k/s1024 --repeat 2
    python benchmarks/bench_engines.py /tmp/diag-synthetic-1024 --generate 1024 --repeat 3
    python benchmarks/bench_engines.py /tmp/diag-synthetic-1024 --against /path/to/other/checkout

``--generate RANKS`` first writes a synthetic format-2 trace of RANKS ranks x 1,000 steps to TRACE_DIR when it
holds none. ``--against DIR``: each run also with the diag of another checkout (its PYTHONPATH), alternated, and
the JSON reports of the inline runs compared byte for byte. The table is ``record.Table``'s (``--json PATH`` saves
it), with each executor's medians as a note.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402
from synthetic_trace import generate_if_missing  # noqa: E402

CODE = (
    "import sys; from diag.analysis import partitioned as P; from diag.views import render; "
    "print(render(P.analyze_partitioned(sys.argv[1], workers=int(sys.argv[2])), 'json'))"
)
EXECUTORS = {"inline": 1, "2 processes": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    parser.add_argument("--against", type=Path, metavar="DIR", help="also run the diag of this checkout")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace_dir, args.generate)
    here = str(Path(__file__).resolve().parents[1])  # this checkout's diag
    checkouts = {"": here} if args.against is None else {"new ": here, "old ": str(args.against)}
    table = Table(
        "engines",
        ["run", "executor", "wall (s)", "CPU (s)", "peak RSS (GB)", "process tree peak PSS (GB)", "load average after"],
    )
    runs: dict[str, list] = {}
    reports: dict[str, set] = {}
    for i in range(args.repeat):
        for executor, workers in EXECUTORS.items():
            for label, path in checkouts.items():
                argv = ["env", f"PYTHONPATH={path}", sys.executable, "-c", CODE, str(args.trace_dir), str(workers)]
                m = run_measured(argv, cwd="/")  # env is exec'd (the same process); / : python -c imports from cwd
                runs.setdefault(label + executor, []).append(m)
                reports.setdefault(label + executor, set()).add(hashlib.sha256(m.stdout.encode()).hexdigest())
                table.add(i + 1, label + executor, f"{m.wall_s:.1f}", f"{m.cpu_s:.1f}", f"{m.peak_rss_gb:.2f}",
                          f"{m.tree_peak_gb:.2f}", f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    table.note(
        "medians: "
        + "; ".join(
            f"{name} {statistics.median(m.wall_s for m in ms):.1f} s wall, "
            f"{statistics.median(m.cpu_s for m in ms):.1f} s CPU, "
            f"{statistics.median(m.peak_rss_gb for m in ms):.2f} GB peak RSS, "
            f"{statistics.median(m.tree_peak_gb for m in ms):.2f} GB tree PSS"
            for name, ms in runs.items()
        )
    )
    if args.against is not None:
        same = reports["new inline"] == reports["old inline"] and len(reports["new inline"]) == 1
        table.note(f"inline JSON reports of old and new byte-identical: {same}")
    table.note(f"{args.trace_dir}: the per-rank passes inline (workers=1) or in 2 worker processes (workers=2)")
    table.save(args.json)


if __name__ == "__main__":
    main()
