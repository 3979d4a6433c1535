"""`diag compare` at scale against `diag analyze`: two synthetic runs of N ranks (real file format, the second
with a compute straggler planted), each command its own process, wall and CPU time and peak RSS (os.wait4).

1. ``diag analyze A --no-cache`` and, after the comparison, ``diag analyze B --no-cache``: one analysis of each
   run, the unit (measured before and after, so that a change in the machine's load shows);
2. ``diag compare A B --no-cache``: loads and analyses both runs, one after the other (the target: at most
   the two analyses together, twice one analysis);
3. ``diag compare A B`` twice: the first writes the tables, reports and compare summaries into each
   ``.diag-cache``, the second reads the summaries only.

The planted straggler must come out as the largest component of B's regression. Directories are deleted.

    python benchmarks/bench_compare.py                  # 1024 ranks x 1000 steps x 20 collectives per step
    python benchmarks/bench_compare.py --ranks 64 --steps 200
    python benchmarks/bench_compare.py --format 2      # the traces as Parquet segments (trace schema 2)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402

from diag.testing import synthetic  # noqa: E402


def diag(*args: str):
    return run_measured([sys.executable, "-m", "diag", *args])


def line(name: str, run) -> str:
    return f"| {name} | {run.wall_s:.1f} s | {run.cpu_s:.1f} s | {run.peak_rss_gb:.2f} GB |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--format", type=int, choices=(1, 2), default=1, help="trace format: 1 CSV, 2 Parquet")
    args = parser.parse_args()
    base, new = args.root / f"diag-bench-compare-{args.ranks}-a", args.root / f"diag-bench-compare-{args.ranks}-b"
    try:
        for path in (base, new):
            shutil.rmtree(path, ignore_errors=True)
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        plants = [synthetic.Plants(), synthetic.Plants(compute_straggler=args.ranks // 3)]
        for seed, (path, plant) in enumerate(zip((base, new), plants, strict=True)):
            synthetic.generate(
                path,
                args.ranks,
                args.steps,
                args.collectives_per_step,
                plants=plant,
                seed=seed,
                trace_format=args.format,
            )
        rows = args.ranks * args.steps * args.collectives_per_step
        print(f"{args.ranks} ranks x {args.steps} steps, {rows:,} collective rows per run, trace format {args.format}")
        print("| command | wall | CPU | peak RSS |\n|---|---|---|---|")
        analyze = diag("analyze", str(base), "--format", "json", "--no-cache")
        print(line("diag analyze A --no-cache", analyze), flush=True)
        uncached = diag("compare", str(base), str(new), "--format", "json", "--no-cache")
        print(line("diag compare A B --no-cache", uncached), flush=True)
        analyze_b = diag("analyze", str(new), "--format", "json", "--no-cache")
        print(line("diag analyze B --no-cache", analyze_b), flush=True)
        first = diag("compare", str(base), str(new), "--format", "json")
        print(line("diag compare A B (writes the caches)", first), flush=True)
        second = diag("compare", str(base), str(new), "--format", "json")
        print(line("diag compare A B (cached summaries)", second), flush=True)
        both_wall, both_cpu = analyze.wall_s + analyze_b.wall_s, analyze.cpu_s + analyze_b.cpu_s
        print(
            f"compare A B / (analyze A + analyze B), no cache: {uncached.wall_s / both_wall:.2f} wall, "
            f"{uncached.cpu_s / both_cpu:.2f} CPU (target: at most 1)"
        )
        data = json.loads(uncached.stdout)
        top = data["attribution"][0]
        print(f"verdict: {data['summary']}")
        ok = data["verdict"] == "regression" and top["component"] == "straggler"
        print("planted straggler:", "largest component" if ok else f"NOT FOUND (top: {top['component']})")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        for path in (base, new):
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
