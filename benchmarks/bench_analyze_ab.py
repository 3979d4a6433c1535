"""`diag analyze TRACE --format json --no-cache --fail-on never` of two code trees, alternated on the same trace:
A/B on a shared machine, where the load changes from minute to minute and back-to-back runs are the fairest
comparison (``--fail-on never``: a trace with problems planted would otherwise end each run with status 1). Each run
is its own process (benchmarks/measured.py): wall time, CPU time (user + system, children included), peak RSS
(os.wait4: the largest process) and the peak summed PSS of the process tree (worker processes included).

    git archive BASE | tar -x -C /tmp/base     # the tree to compare against
    python benchmarks/bench_analyze_ab.py /tmp/cold16k/s1024 --base /tmp/base --repeat 2
    python benchmarks/bench_analyze_ab.py /tmp/diag-synthetic-1024 --generate 1024 --base-rev HEAD --repeat 4

``--base-rev REV`` unpacks ``git archive REV`` of this repository into a temporary folder and uses it as the base:
with ``HEAD`` and no change to diag/, both sides run the same code, an A/A comparison that shows how far two
alternated runs of the same analysis differ on this machine. ``--generate RANKS`` first writes a synthetic
format-2 trace of RANKS ranks x 1,000 steps to TRACE_DIR when it holds none. The table is ``record.Table``'s
(``--json PATH`` saves it), with each side's medians and their ratio as notes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402
from synthetic_trace import generate_if_missing  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def archived(rev: str, into: Path) -> Path:
    """``git archive REV`` of this repository, unpacked in ``into``."""
    archive = subprocess.run(["git", "archive", rev], cwd=HERE, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def compare(trace_dir: Path, base: Path, repeat: int, base_label: str) -> Table:
    table = Table(
        "analyze_ab",
        ["run", "code", "wall (s)", "CPU (s)", "peak RSS (GB)", "process tree peak PSS (GB)", "load average after"],
    )
    runs: dict[str, list] = {"base": [], "this tree": []}
    for i in range(repeat):
        for name, root in (("base", base), ("this tree", HERE)):
            # the child imports diag from this tree: PYTHONPATH, and run from it (python -m puts the working
            # directory first on sys.path: run from another checkout, both runs imported that checkout's diag)
            os.environ["PYTHONPATH"] = str(root)
            # --fail-on never: a trace with problems planted would otherwise end each run with exit status 1
            m = run_measured([sys.executable, "-m", "diag", "analyze", str(trace_dir.resolve()), "--format",
                              "json", "--no-cache", "--fail-on", "never"], cwd=root)  # fmt: skip
            runs[name].append(m)
            table.add(i + 1, name, f"{m.wall_s:.1f}", f"{m.cpu_s:.1f}", f"{m.peak_rss_gb:.2f}", f"{m.tree_peak_gb:.2f}",
                      f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    med = {
        name: {k: statistics.median(getattr(m, k) for m in ms) for k in ("wall_s", "cpu_s")}
        for name, ms in runs.items()
    }
    table.note(
        f"base: {base_label}; {repeat} runs of each, alternated; diag analyze {trace_dir} --format json --no-cache "
        "--fail-on never"
    )
    table.note(
        f"medians: base {med['base']['wall_s']:.1f} s wall, {med['base']['cpu_s']:.1f} s CPU; this tree "
        f"{med['this tree']['wall_s']:.1f} s wall, {med['this tree']['cpu_s']:.1f} s CPU; this tree / base: "
        f"wall {med['this tree']['wall_s'] / med['base']['wall_s']:.3f}, CPU {med['this tree']['cpu_s'] / med['base']['cpu_s']:.3f}"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", type=Path, help="the other code tree (a git archive of it)")
    base.add_argument("--base-rev", metavar="REV", help="git archive REV of this repository as the other tree")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace_dir, args.generate)
    if args.base is not None:
        compare(args.trace_dir, args.base, args.repeat, str(args.base)).save(args.json)
        return
    with tempfile.TemporaryDirectory(prefix="diag-base-") as tmp:
        label = f"git archive {args.base_rev}"
        compare(args.trace_dir, archived(args.base_rev, Path(tmp)), args.repeat, label).save(args.json)


if __name__ == "__main__":
    main()
