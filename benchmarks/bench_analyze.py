"""`diag analyze` at scale: synthetic traces of 256, 512 and 1024 ranks x 1000 steps x 20 collectives per step
(real file format, problems planted at known ranks), each analysed three times as a user would run it:

1. first run: CSV parsing, analysis, and writing the cache next to the traces;
2. second run, same options: the report comes from the cache;
3. a run with other options (``--steps 100:900``): tables from the cache, analysis redone.

Wall time and peak RSS are measured per `diag analyze` process (os.wait4), and the JSON report of the first
run is checked against the planted problems. Generated directories are deleted afterwards.

    python benchmarks/bench_analyze.py                 # 256, 512, 1024 ranks
    python benchmarks/bench_analyze.py --ranks 64 --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402

from diag.testing import synthetic  # noqa: E402


def run_analyze(trace_dir: Path, *args: str) -> tuple[str, float, str]:
    """Wall s (CPU s), peak RSS (GB) and stdout of one ``diag analyze`` process."""
    run = run_measured([sys.executable, "-m", "diag", "analyze", str(trace_dir), "--format", "json", *args])
    return f"{run.wall_s:.1f} s ({run.cpu_s:.1f} s)", run.peak_rss_gb, run.stdout


def check_planted(report: dict, plants: synthetic.Plants) -> list[str]:
    """What the report got wrong about the planted problems (empty: all found, at the right ranks)."""
    problems = []
    persistent = {s["rank"]: s["cause"] for s in report["stragglers"] if s["persistent"]}
    expected = {plants.compute_straggler: "compute", plants.data_straggler: "data", plants.throttled: "throttle"}
    if persistent != expected:
        problems.append(f"persistent stragglers {persistent}, planted {expected}")
    transient = [s["rank"] for s in report["stragglers"] if not s["persistent"]]
    if transient != [plants.transient]:
        problems.append(f"transient stragglers {transient}, planted [{plants.transient}]")
    leaks = [f["ranks"] for f in report["findings"] if f["kind"] == "memory_leak"]
    if leaks != [[plants.leak]]:
        problems.append(f"leaks {leaks}, planted [{plants.leak}]")
    throttled = [f["ranks"] for f in report["findings"] if f["kind"] == "gpu_throttle"]
    if throttled != [[plants.throttled]]:
        problems.append(f"throttled GPUs {throttled}, planted [{plants.throttled}]")
    return problems


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
        problems = check_planted(json.loads(text), plants)
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
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print("Times are wall (CPU user+system) per diag analyze process.")
    print(
        "| ranks | collective rows | trace size | generate | first run | peak RSS | second run (cached report) | peak RSS | other --steps (cached tables) | peak RSS | planted problems |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ranks in args.ranks:
        r = bench(ranks, args.steps, args.collectives_per_step, args.root)
        found = "all found" if not r["problems"] else "; ".join(r["problems"])
        print(
            f"| {ranks} | {r['collective_rows']:,} | {r['trace_gb']:.2f} GB | {r['generate_s']:.1f} s | {r['first_s']} | "
            f"{r['first_gb']:.2f} GB | {r['second_s']} | {r['second_gb']:.2f} GB | {r['other_steps_s']} | "
            f"{r['other_steps_gb']:.2f} GB | {found} |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
