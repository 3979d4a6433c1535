"""The partitioned analysis of one trace with the per-rank passes on threads (LocalEngine) and in two worker
processes (ProcessEngine, the default from diag.processes.PROCESS_MIN_RANKS ranks), alternated, each run its own
process (benchmarks/measured.py): wall, CPU (worker processes included), largest process's peak RSS, and the peak
summed PSS of the process tree.

    python benchmarks/bench_engines.py /tmp/cold16k/s1024 --repeat 2
    python benchmarks/bench_engines.py /tmp/diag-synthetic-1024 --generate 1024 --repeat 3

``--generate RANKS`` first writes a synthetic format-2 trace of RANKS ranks x 1,000 steps to TRACE_DIR when it
holds none. The table is ``record.Table``'s (``--json PATH`` saves it), with each engine's medians as a note.
"""

from __future__ import annotations

import argparse
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
    "engine = P.LocalEngine() if sys.argv[2] == 'threads' else P.ProcessEngine(2); "
    "render(P.analyze_partitioned(sys.argv[1], engine=engine), 'json')"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace_dir, args.generate)
    table = Table(
        "engines",
        ["run", "engine", "wall (s)", "CPU (s)", "peak RSS (GB)", "process tree peak PSS (GB)", "load average after"],
    )
    runs: dict[str, list] = {"threads": [], "processes": []}
    for i in range(args.repeat):
        for engine in ("threads", "processes"):
            m = run_measured([sys.executable, "-c", CODE, str(args.trace_dir), engine])
            runs[engine].append(m)
            table.add(i + 1, engine, f"{m.wall_s:.1f}", f"{m.cpu_s:.1f}", f"{m.peak_rss_gb:.2f}",
                      f"{m.tree_peak_gb:.2f}", f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    table.note(
        "medians: "
        + "; ".join(
            f"{engine} {statistics.median(m.wall_s for m in ms):.1f} s wall, "
            f"{statistics.median(m.cpu_s for m in ms):.1f} s CPU, "
            f"{statistics.median(m.tree_peak_gb for m in ms):.2f} GB tree PSS"
            for engine, ms in runs.items()
        )
    )
    table.note(f"{args.trace_dir}: the per-rank passes on threads (LocalEngine) or 2 worker processes (ProcessEngine)")
    table.save(args.json)


if __name__ == "__main__":
    main()
