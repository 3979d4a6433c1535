"""`diag analyze TRACE --format json --no-cache` of two code trees, alternated on the same trace: A/B on a shared
machine, where the load changes from minute to minute and back-to-back runs are the fairest comparison. Each run
is its own process (benchmarks/measured.py): wall time, CPU time (user + system, children included), peak RSS
(os.wait4: the largest process) and the peak summed PSS of the process tree (worker processes included).

    git archive BASE | tar -x -C /tmp/base     # the tree to compare against
    python benchmarks/bench_analyze_ab.py /tmp/cold16k/s1024 --base /tmp/base --repeat 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--base", type=Path, required=True, help="the other code tree (a git archive of it)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(
        "| run | code | wall | CPU | peak RSS | process tree peak PSS | load average after |\n|---|---|---|---|---|---|---|"
    )
    for i in range(args.repeat):
        for name, root in (("base", args.base), ("this tree", HERE)):
            # the child imports diag from this tree: PYTHONPATH, and run from it (python -m puts the working
            # directory first on sys.path: run from another checkout, both runs imported that checkout's diag)
            os.environ["PYTHONPATH"] = str(root)
            m = run_measured([sys.executable, "-m", "diag", "analyze", str(args.trace_dir.resolve()), "--format",
                              "json", "--no-cache"], cwd=root)  # fmt: skip
            print(f"| {i + 1} | {name} | {m.wall_s:.1f} s | {m.cpu_s:.1f} s | {m.peak_rss_gb:.2f} GB | "
                  f"{m.tree_peak_gb:.2f} GB | {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
