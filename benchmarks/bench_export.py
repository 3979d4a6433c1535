"""`diag export --perfetto` at scale: a synthetic run (real file format, ``diag.testing.synthetic``) exported whole and as
a window of 10 steps, each as its own ``python -m diag export`` process, as a user would run it.

Wall time, CPU time and peak RSS per process (os.wait4); the file's size and event count; and that the file
is one valid JSON document in the Chrome trace event format. The generated directory is deleted afterwards.

    python benchmarks/bench_export.py --ranks 64 --steps 1000
    python benchmarks/bench_export.py --ranks 1024 --format 2 --windows 1 10 100 --no-whole --previous

``--windows``: export ``--steps 500:500+N`` for each N (time and memory should follow N, not the run);
``--previous``: also the previous export (``diag.load`` of every table, then ``write_chrome_trace``) of the first
window, in its own process; ``--trace DIR``: an existing synthetic run instead of generating one (kept);
``--base DIR``: another checkout of diag (e.g. ``git archive main | tar -x -C DIR``): each export is also run
with its code (``PYTHONPATH=DIR``), just before this checkout's, so the two see the same machine load:

    python benchmarks/bench_export.py --trace /tmp/export2/s1024 --windows 1 10 100 --base /tmp/export2/base

``--json PATH`` also saves the table (record.Table).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.testing import synthetic  # noqa: E402


def run_export(trace_dir: Path, out: Path, *args: str, code: Path | None = None) -> dict:
    """One export as its own process; ``code``: run with that checkout's diag, from that directory (``python -m``
    puts the working directory first on sys.path, before PYTHONPATH: from here it would import this checkout);
    ``env`` execs python in place, so os.wait4 still measures the export itself."""
    prefix = ["env", "-C", str(code), f"PYTHONPATH={code}"] if code is not None else []
    argv = [*prefix, sys.executable, "-m", "diag", "export", str(trace_dir), "--perfetto", str(out), *args]
    run = run_measured(argv)
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


PARSE_MAX_BYTES = 1 << 30  # json.load of a file holds ~5x its size: larger files are checked line by line


LINE_BY_LINE = r"""
import json, sys
lines = open(sys.argv[1])
assert next(lines) == '{"displayTimeUnit": "ms", "traceEvents": [\n'
count = 0
for line in lines:
    if line in ("\n", "]}\n"):
        continue
    json.loads(line.rstrip("\n").rstrip(","))
    count += 1
print(count)
"""


def parsed_event_count(path: Path) -> int:
    """Parse the whole file as Perfetto would, in a child process, so that this process stays small (see
    measured.py). Above PARSE_MAX_BYTES (a whole 1,024-rank run is ~6 GB) each event line is parsed on its own
    (the writer puts one event a line between the document's first and last lines)."""
    check = "import json, sys; print(len(json.load(open(sys.argv[1]))['traceEvents']))"
    if path.stat().st_size > PARSE_MAX_BYTES:
        check = LINE_BY_LINE
    return int(subprocess.run([sys.executable, "-c", check, str(path)], capture_output=True, check=True).stdout)


PREVIOUS_EXPORT = """
import sys
import diag
from diag.views.perfetto import write_chrome_trace
a, b = map(int, sys.argv[3].split(":"))
print(write_chrome_trace(diag.load(sys.argv[1]), sys.argv[2], (a, b)), file=sys.stderr)
"""


def run_previous(trace_dir: Path, out: Path, window: str) -> dict:
    """The export as it was before it read rank by rank: every table of every rank loaded, then written."""
    run = run_measured([sys.executable, "-c", PREVIOUS_EXPORT, str(trace_dir), str(out), window])
    events = int(run.stderr.strip().splitlines()[-1])
    assert parsed_event_count(out) == events
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_rss_gb": run.peak_rss_gb,
            "file_mb": out.stat().st_size / 1e6, "events": events}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--format", type=int, default=1, choices=(1, 2), help="trace schema version generated")
    parser.add_argument("--windows", type=int, nargs="*", default=[10], help="steps per exported window")
    parser.add_argument("--ranges", nargs="+", default=[], metavar="A:B", help="also export --steps A:B")
    parser.add_argument("--no-whole", action="store_true", help="skip the export of the whole run")
    parser.add_argument("--export-ranks", type=int, help="export only ranks 0..N-1 (every rank is still read once)")
    parser.add_argument("--previous", action="store_true", help="also the previous (load everything) export")
    parser.add_argument("--trace", type=Path, help="an existing synthetic run (not generated, not deleted)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--base", type=Path, help="another checkout of diag, run before this one for each export")
    add_json_option(parser)
    args = parser.parse_args()
    trace_dir = args.trace or args.root / f"diag-bench-export-{args.ranks}"
    if args.trace is None:
        shutil.rmtree(trace_dir, ignore_errors=True)
    try:
        if args.trace is None:
            synthetic.generate(trace_dir, args.ranks, args.steps, args.collectives_per_step, trace_format=args.format)
        size_mb = sum(f.stat().st_size for f in trace_dir.rglob("*") if f.is_file()) / 1e6
        ranks = len([d for d in trace_dir.iterdir() if d.name.startswith("rank")])
        print(f"{ranks} ranks: {size_mb:.0f} MB of traces; load average {os.getloadavg()[0]:.1f}", flush=True)
        table = Table("export", [f"export, {ranks:,} ranks", "wall", "CPU", "peak RSS", "file", "events"])
        runs = [] if args.no_whole else [("whole run", ())]
        runs += [(f"`--steps 500:{500 + n}` ({n} step{'s' if n > 1 else ''})", ("--steps", f"500:{500 + n}"))
                 for n in args.windows]  # fmt: skip
        runs += [(f"`--steps {r}`", ("--steps", r)) for r in args.ranges]
        out = trace_dir.parent / "diag-bench-export.json"
        base_out = trace_dir.parent / "diag-bench-export-base.json"
        if args.export_ranks:
            subset = ("--ranks", ",".join(map(str, range(args.export_ranks))))
            runs = [(f"{label}, ranks 0-{args.export_ranks - 1}", (*extra, *subset)) for label, extra in runs]
        whole = None
        for label, extra in runs:
            if args.base is not None:
                show(table, f"base: {label}", run_export(trace_dir, base_out, *extra, code=args.base.resolve()))
            result = run_export(trace_dir, out, *extra)
            show(table, label, result)
            whole = result if label == "whole run" else whole
            if args.base is not None:  # the same window must give the same file, byte for byte
                table.note(f"{label}: the same file as base's: {filecmp.cmp(base_out, out, shallow=False)}")
                base_out.unlink()
        if args.previous:
            window = f"500:{500 + args.windows[0]}"
            show(
                table,
                f"previous, --steps {window}",
                run_previous(trace_dir, trace_dir.parent / "diag-bench-export.json", window),
            )
        table.note(f"the trace: {ranks:,} ranks, {size_mb:,.1f} MB on disk; each export its own process")
        if whole is not None and args.trace is None:
            per = ranks * args.steps
            table.note(
                f"whole run: {whole['events'] / per:.1f} events and {whole['file_mb'] * 1e3 / per:.1f} KB a rank "
                f"and step; {whole['cpu_s'] / whole['events'] * 1e6:.1f} us of CPU an event"
            )
        table.save(args.json)
    finally:
        (trace_dir.parent / "diag-bench-export.json").unlink(missing_ok=True)
        (trace_dir.parent / "diag-bench-export-base.json").unlink(missing_ok=True)
        if args.trace is None:
            shutil.rmtree(trace_dir, ignore_errors=True)


def show(table: Table, label: str, result: dict) -> None:
    table.add(
        label,
        f"{result['wall_s']:.1f} s",
        f"{result['cpu_s']:.1f} s",
        f"{result['peak_rss_gb']:.2f} GB",
        f"{result['file_mb']:,.1f} MB",
        f"{result['events']:,}",
    )


if __name__ == "__main__":
    main()
