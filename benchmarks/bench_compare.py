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
    python benchmarks/bench_compare.py --ranks 64 --format 2   # the suite's size (benchmarks/suite.py)
    python benchmarks/bench_compare.py --format 2      # the traces as Parquet segments (trace schema 2)

``--json PATH`` also saves the table (record.Table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.testing import synthetic  # noqa: E402


def diag(*args: str):
    """``--fail-on never``: the runs hold planted problems, and a found one would otherwise exit 1."""
    return run_measured([sys.executable, "-m", "diag", *args, "--fail-on", "never"])


def add(table: Table, name: str, run) -> None:
    table.add(name, f"{run.wall_s:.1f} s", f"{run.cpu_s:.1f} s", f"{run.peak_rss_gb:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--format", type=int, choices=(1, 2), default=1, help="trace format: 1 CSV, 2 Parquet")
    add_json_option(parser)
    args = parser.parse_args()
    base, new = args.root / f"diag-bench-compare-{args.ranks}-a", args.root / f"diag-bench-compare-{args.ranks}-b"
    try:
        for path in (base, new):
            shutil.rmtree(path, ignore_errors=True)
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
        table = Table("compare", ["command", "wall", "CPU", "peak RSS"])
        analyze = diag("analyze", str(base), "--format", "json", "--no-cache")
        add(table, "`diag analyze A --no-cache`", analyze)
        uncached = diag("compare", str(base), str(new), "--format", "json", "--no-cache")
        add(table, "`diag compare A B --no-cache`", uncached)
        analyze_b = diag("analyze", str(new), "--format", "json", "--no-cache")
        add(table, "`diag analyze B --no-cache`", analyze_b)
        first = diag("compare", str(base), str(new), "--format", "json")
        add(table, "`diag compare A B` (writes the caches)", first)
        second = diag("compare", str(base), str(new), "--format", "json")
        add(table, "`diag compare A B` (cached summaries)", second)
        table.note(
            f"{args.ranks:,} ranks x {args.steps:,} steps, {rows:,} collective rows per run, trace format "
            f"{args.format}; each command its own process"
        )
        both_wall, both_cpu = analyze.wall_s + analyze_b.wall_s, analyze.cpu_s + analyze_b.cpu_s
        table.note(
            f"compare A B / (analyze A + analyze B), no cache: {uncached.wall_s / both_wall:.2f} wall, "
            f"{uncached.cpu_s / both_cpu:.2f} CPU (target: at most 1)"
        )
        data = json.loads(uncached.stdout)
        top = data["attribution"][0]
        ok = data["verdict"] == "regression" and top["component"] == "straggler"
        planted = "the largest component" if ok else f"NOT FOUND (top: {top['component']})"
        table.note(f"verdict: {data['summary']}; the planted straggler: {planted}")
        table.save(args.json)
    finally:
        for path in (base, new):
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
