"""``diag triage --format json`` on one trace by two checkouts side by side (``--old`` against ``--new``, each run
from its directory with ``PYTHONPATH`` set to it), with each ``--workers`` count: ``--repeat`` rounds, the old and
new runs alternated (the order flipped every round), medians of wall time, CPU time (the triage process with its
worker processes: os.wait4), peak RSS (the largest one process's) and the process tree's peak PSS
(``measured.run_measured``). Every run's JSON must be identical, evidence and every rank's state included.

    python3 -m diag.testing.synthetic /tmp/hang1024 --ranks 1024 --steps 200 --format 2 --hang
    python benchmarks/bench_triage_ab.py /tmp/hang1024 --old /work/main --new . --workers 1 2 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402

# exit status 1 is triage's "a problem found": the hang
TRIAGE = 'python3 -m diag triage "$@"; test $? -le 1'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[tuple[str, int], list] = {}
    outputs = set()
    for round_ in range(args.repeat):
        for workers in args.workers:
            for label in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                checkout = checkouts[label]
                argv = ["env", "-u", "PYTHONPATH", f"PYTHONPATH={checkout}", "sh", "-c", TRIAGE, "sh"]
                argv += [str(args.trace.resolve()), "--format", "json", "--workers", str(workers)]
                run = run_measured(argv, cwd=checkout)
                runs.setdefault((label, workers), []).append(run)
                outputs.add(run.stdout)
                print(
                    f"round {round_ + 1} {label} --workers {workers}: {run.wall_s:.2f} s, CPU {run.cpu_s:.2f} s",
                    file=sys.stderr,
                )
    table = Table("triage_ab", ["checkout", "--workers", "wall s", "CPU s", "peak RSS GB", "tree peak PSS GB"])
    for (label, workers), measured in runs.items():
        table.add(
            f"{label} ({checkouts[label]})",
            workers,
            f"{statistics.median(r.wall_s for r in measured):.2f}",
            f"{statistics.median(r.cpu_s for r in measured):.2f}",
            f"{statistics.median(r.peak_rss_gb for r in measured):.3f}",
            f"{statistics.median(r.tree_peak_gb for r in measured):.3f}",
        )
    table.note(f"medians of {args.repeat} alternated runs each; {len(outputs)} distinct JSON output(s) in all")
    table.save(args.json)
    if len(outputs) != 1:
        raise SystemExit(f"the JSON outputs differ: {len(outputs)} distinct")


if __name__ == "__main__":
    main()
