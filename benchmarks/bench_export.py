"""`diag export --perfetto` at scale: a synthetic run (real file format, ``synthetic.py``) exported whole and as
a window of 10 steps, each as its own ``python -m diag export`` process, as a user would run it.

Wall time, CPU time and peak RSS per process (os.wait4); the file's size and event count; and that the file
is one valid JSON document in the Chrome trace event format. The generated directory is deleted afterwards.

    python benchmarks/bench_export.py --ranks 64 --steps 1000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from measured import run_measured  # noqa: E402


def run_export(trace_dir: Path, out: Path, *args: str) -> dict:
    run = run_measured([sys.executable, "-m", "diag", "export", str(trace_dir), "--perfetto", str(out), *args])
    events = int(re.search(r"(\d+) events from", run.stderr).group(1))
    parsed = parsed_event_count(out)
    assert parsed == events, (parsed, events)
    return {
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "peak_rss_gb": run.peak_rss_gb,
        "file_mb": out.stat().st_size / 1e6,
        "events": events,
    }


def parsed_event_count(path: Path) -> int:
    """Parse the whole file as Perfetto would, in a child process, so that this process stays small (see
    measured.py)."""
    check = "import json, sys; print(len(json.load(open(sys.argv[1]))['traceEvents']))"
    return int(subprocess.run([sys.executable, "-c", check, str(path)], capture_output=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    trace_dir = args.root / f"diag-bench-export-{args.ranks}"
    shutil.rmtree(trace_dir, ignore_errors=True)
    try:
        synthetic.generate(trace_dir, args.ranks, args.steps, args.collectives_per_step)
        size_mb = sum(f.stat().st_size for f in trace_dir.rglob("*") if f.is_file()) / 1e6
        print(
            f"{args.ranks} ranks x {args.steps} steps x {args.collectives_per_step} collectives per step: "
            f"{size_mb:.0f} MB of traces; load average {os.getloadavg()[0]:.1f}"
        )
        print(f"{'export':<22} {'wall s':>7} {'CPU s':>7} {'peak RSS GB':>12} {'file MB':>8} {'events':>11}")
        for label, extra in (("whole run", ()), ("--steps 500:510", ("--steps", "500:510"))):
            result = run_export(trace_dir, trace_dir / "out.json", *extra)
            print(
                f"{label:<22} {result['wall_s']:>7.1f} {result['cpu_s']:>7.1f} {result['peak_rss_gb']:>12.2f} "
                f"{result['file_mb']:>8.0f} {result['events']:>11,}"
            )
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
