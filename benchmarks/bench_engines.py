"""The partitioned analysis of one trace with the per-rank passes on threads (LocalEngine) and in two worker
processes (ProcessEngine, the default from diag.processes.PROCESS_MIN_RANKS ranks), alternated, each run its own
process (benchmarks/measured.py): wall, CPU (worker processes included), largest process's peak RSS, and the peak
summed PSS of the process tree.

    python benchmarks/bench_engines.py /tmp/cold16k/s1024 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402

CODE = (
    "import sys; from diag.analysis import partitioned as P; from diag.views import render; "
    "engine = P.LocalEngine() if sys.argv[2] == 'threads' else P.ProcessEngine(2); "
    "render(P.analyze_partitioned(sys.argv[1], engine=engine), 'json')"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print("| run | engine | wall | CPU | peak RSS | process tree peak PSS | load average after |")
    print("|---|---|---|---|---|---|---|")
    for i in range(args.repeat):
        for engine in ("threads", "processes"):
            m = run_measured([sys.executable, "-c", CODE, str(args.trace_dir), engine])
            print(f"| {i + 1} | {engine} | {m.wall_s:.1f} s | {m.cpu_s:.1f} s | {m.peak_rss_gb:.2f} GB | "
                  f"{m.tree_peak_gb:.2f} GB | {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
