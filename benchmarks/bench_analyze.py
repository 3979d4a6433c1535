"""`diag analyze` at scale: synthetic traces of 256, 512 and 1024 ranks x 1000 steps x 20 collectives per step
(real file format, problems planted at known ranks), each analysed three times as a user would run it:

1. first run: CSV parsing, analysis, and writing the cache next to the traces;
2. second run, same options: the report comes from the cache;
3. a run with other options (``--steps 100:900``): tables from the cache, analysis redone.

Wall time and peak RSS are measured per `diag analyze` process (os.wait4), and the JSON report of the first
run is checked against the planted problems. Generated directories are deleted afterwards.

    python benchmarks/bench_analyze.py                 # 256, 512, 1024 ranks
    python benchmarks/bench_analyze.py --ranks 64      # the suite's size (benchmarks/suite.py): the in-memory path
    python benchmarks/bench_analyze.py --ranks 64 --steps 200

Up to 64 ranks ``diag analyze`` loads every table whole and caches the tables; above, it reads rank by rank and
caches the report only. ``--json PATH`` also saves the table (record.Table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.testing import synthetic  # noqa: E402


def run_analyze(trace_dir: Path, *args: str) -> tuple[str, float, str]:
    """Wall s (CPU s), peak RSS (GB) and stdout of one ``diag analyze`` process (``--fail-on never``: the planted
    problems would make it exit 1)."""
    argv = [sys.executable, "-m", "diag", "analyze", str(trace_dir), "--format", "json", "--fail-on", "never", *args]
    run = run_measured(argv)
    return f"{run.wall_s:.1f} s ({run.cpu_s:.1f} s)", run.peak_rss_gb, run.stdout


def bench(ranks: int, steps: int, collectives: int, root: Path) -> dict:
    trace_dir = root / f"diag-bench-{ranks}"
    shutil.rmtree(trace_dir, ignore_errors=True)
    try:
        start = time.perf_counter()
        plants = synthetic.generate(trace_dir, ranks, steps, collectives)
        generate_s = time.perf_counter() - start
        size_gb = sum(f.stat().st_size for f in trace_dir.rglob("*") if f.is_file()) / 1e9
        first_s, first_gb, text = run_analyze(trace_dir)
        second_s, second_gb, second_text = run_analyze(trace_dir)
        other_s, other_gb, _ = run_analyze(trace_dir, "--steps", "100:900")
        problems = synthetic.check_planted(json.loads(text), plants)
        if second_text != text:
            problems.append("the cached report differs from the first")
        return {
            "ranks": ranks,
            "steps": steps,
            "collective_rows": ranks * steps * collectives,
            "trace_gb": size_gb,
            "generate_s": generate_s,
            "first_s": first_s,
            "first_gb": first_gb,
            "second_s": second_s,
            "second_gb": second_gb,
            "other_steps_s": other_s,
            "other_steps_gb": other_gb,
            "problems": problems,
        }
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    add_json_option(parser)
    args = parser.parse_args()
    table = Table(
        "analyze",
        [
            "ranks",
            "collective rows",
            "trace size",
            "generate",
            "first run",
            "peak RSS",
            "second run (cached report)",
            "peak RSS",
            "other --steps",
            "peak RSS",
            "planted problems",
        ],
    )
    for ranks in args.ranks:
        r = bench(ranks, args.steps, args.collectives_per_step, args.root)
        found = "all found" if not r["problems"] else "; ".join(r["problems"])
        table.add(
            f"{ranks:,}",
            f"{r['collective_rows']:,}",
            f"{r['trace_gb']:.2f} GB",
            f"{r['generate_s']:.1f} s",
            r["first_s"],
            f"{r['first_gb']:.2f} GB",
            r["second_s"],
            f"{r['second_gb']:.2f} GB",
            r["other_steps_s"],
            f"{r['other_steps_gb']:.2f} GB",
            found,
        )
    table.note(
        f"{args.steps:,} steps; times are wall (CPU user+system) of each diag analyze process; other --steps: "
        "--steps 100:900"
    )
    table.save(args.json)


if __name__ == "__main__":
    main()
