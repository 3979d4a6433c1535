"""diag vs Holistic Trace Analysis on the same torch.profiler (Kineto) traces: wall time, peak memory, and
the agreement of the numbers both compute (temporal breakdown, communication/computation overlap).

Each tool runs in its own fresh subprocess (imports included in its time); CPU time is that process's and
its children's (user + system); peak memory is the largest summed RSS of that process and all its children
(HTA parses ranks in a multiprocessing pool), sampled every 20 ms with psutil. diag analyses the steps HTA does (all but the last ProfilerStep). HTA runs with
HTA_DISABLE_NS_ROUNDING=1 (keep the recorded float timestamps, as diag does) and, for the agreement table
only, also with its default rounding.

usage:
  python benchmarks/bench_kineto.py --fixtures              # the real traces in ../shared/fixtures
  python benchmarks/bench_kineto.py --scaled 8 [--work DIR] # 8 ranks made from HTA's df_index_resolver trace

``--json PATH`` saves the table (record.Table); ``--rows-json PATH`` every row with all of both tools' numbers.
``DIAG_SHARED_FIXTURES`` names another fixtures directory than ../shared/fixtures.

Needs ``pip install --no-deps HolisticTraceAnalysis==0.5.0 networkx pydot psutil`` (HTA 0.5.0 declares
jupyterlab and pytest as dependencies but does not import them for these analyses).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from record import Table, add_json_option  # noqa: E402

FIXTURES = Path(os.environ.get("DIAG_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))
FIXTURE_DIRS = ["hta-public/nccl_parser_config", "hta-public/df_index_resolver", "gpu-h100"]
KEYS = ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct")


def child_diag(path: str) -> dict:
    import numpy as np

    from diag.analysis.report import analyze
    from diag.trace.kineto import load_kineto

    trace = load_kineto(path)
    steps = np.sort(trace.steps["step"].unique())
    report = analyze(trace, steps=f"{steps[0]}:{steps[-1]}")
    return {
        str(r.rank): {
            "idle_pct": r.idle_pct,
            "compute_pct": r.compute_pct,
            "non_compute_pct": r.non_compute_pct,
            "overlap_pct": r.comm_comp_overlap_pct,
        }
        for r in report.gpu_time.per_rank
    }


def child_hta(path: str) -> dict:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=path)
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    out = {}
    for rank, row in breakdown.iterrows():
        value = float(overlap.get(rank))
        out[str(rank)] = {
            "idle_pct": float(row["idle_time_pctg"]),
            "compute_pct": float(row["compute_time_pctg"]),
            "non_compute_pct": float(row["non_compute_time_pctg"]),
            "overlap_pct": None if value != value else value,  # NaN: no communication
        }
    return out


def run_tool(tool: str, path: Path, rounding: bool = False) -> dict:
    """Run one tool in a fresh process; its wall and CPU time, peak RSS of its process tree, and its numbers."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if tool == "hta" and not rounding:
        env["HTA_DISABLE_NS_ROUNDING"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", tool, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - start
    stdout, stderr = proc.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the tool's process and the children it waited for
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed on {path}:\n{stderr.decode()[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": peak / 2**20,
        "numbers": json.loads(stdout.decode().strip().splitlines()[-1]),
    }


def size_mib(path: Path) -> tuple[float, float]:
    """Size on disk and uncompressed, MiB."""
    files = [p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))]
    disk = sum(p.stat().st_size for p in files)
    plain = 0
    for p in files:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    plain += len(chunk)
        else:
            plain += p.stat().st_size
    return disk / 2**20, plain / 2**20


def max_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for rank, values in a.items():
        for key in KEYS:
            x, y = values.get(key), b.get(rank, {}).get(key)
            if x is None and y is None:
                continue
            if x is None or y is None:
                return float("inf")
            worst = max(worst, abs(x - y))
    return worst


def compare(path: Path, label: str) -> dict:
    disk, plain = size_mib(path)
    diag = run_tool("diag", path)
    hta = run_tool("hta", path)
    hta_rounded = run_tool("hta", path, rounding=True)
    row = {
        "traces": label,
        "ranks": len(diag["numbers"]),
        "disk_mib": disk,
        "json_mib": plain,
        "diag_s": diag["wall_s"],
        "hta_s": hta["wall_s"],
        "diag_cpu_s": diag["cpu_s"],
        "hta_cpu_s": hta["cpu_s"],
        "diag_peak_mib": diag["peak_rss_mib"],
        "hta_peak_mib": hta["peak_rss_mib"],
        "max_diff_pct_points": max_difference(diag["numbers"], hta["numbers"]),
        "max_diff_vs_hta_rounding_pct_points": max_difference(diag["numbers"], hta_rounded["numbers"]),
        "diag": diag["numbers"],
        "hta": hta["numbers"],
        "hta_rounded": hta_rounded["numbers"],
    }
    print(json.dumps(row), file=sys.stderr)
    return row


def make_scaled(work: Path, ranks: int) -> Path:
    """``ranks`` copies of HTA's df_index_resolver trace (rank 1 of a 2-GPU job), each with its own rank, as
    plain JSON: a multi-rank directory of real events at a realistic size."""
    out = work / f"scaled_{ranks}"
    source = FIXTURES / "hta-public" / "df_index_resolver" / "df_index_resolver.json.gz"
    out.mkdir(parents=True, exist_ok=True)
    text = gzip.decompress(source.read_bytes())
    marker = b'"distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2}'
    assert marker in text, "unexpected fixture header"
    for rank in range(ranks):
        target = out / f"rank{rank}.pt.trace.json"
        if not target.exists():
            info = f'"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {ranks}}}'.encode()
            target.write_bytes(text.replace(marker, info))
    return out


COLUMNS = [
    "traces",
    "ranks",
    "JSON MiB",
    "diag s (CPU)",
    "HTA s (CPU)",
    "faster",
    "diag peak MiB",
    "HTA peak MiB",
    "less memory",
    "max diff (pp)",
    "vs HTA rounding (pp)",
]


def add_row(table: Table, r: dict) -> None:
    table.add(
        r["traces"],
        r["ranks"],
        f"{r['json_mib']:,.0f}",
        f"{r['diag_s']:.2f} ({r['diag_cpu_s']:.2f})",
        f"{r['hta_s']:.2f} ({r['hta_cpu_s']:.2f})",
        f"{r['hta_s'] / r['diag_s']:.1f}x",
        f"{r['diag_peak_mib']:,.0f}",
        f"{r['hta_peak_mib']:,.0f}",
        f"{r['hta_peak_mib'] / r['diag_peak_mib']:.1f}x",
        f"{r['max_diff_pct_points']:.3f}",
        f"{r['max_diff_vs_hta_rounding_pct_points']:.3f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--fixtures", action="store_true", help="compare on the real traces in ../shared/fixtures")
    parser.add_argument("--scaled", type=int, metavar="RANKS", help="compare on RANKS copies of a real trace")
    parser.add_argument("--work", type=Path, default=Path("/tmp/diag-bench-kineto"), help="where scaled traces go")
    parser.add_argument("--rows-json", type=Path, help="also write the rows (with every number) to this file")
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        tool, path = args.child
        print(json.dumps(child_diag(path) if tool == "diag" else child_hta(path)))
        return
    if not (args.fixtures or args.scaled):
        parser.error("give --fixtures and/or --scaled RANKS")
    # the suite's names: kineto_fixtures and kineto_scaled run one part each
    table = Table(
        "kineto" + ("" if args.fixtures and args.scaled else "_fixtures" if args.fixtures else "_scaled"), COLUMNS
    )
    rows = []
    if args.fixtures:
        for name in FIXTURE_DIRS:
            rows.append(compare(FIXTURES / name, name))
            add_row(table, rows[-1])
    if args.scaled:
        rows.append(compare(make_scaled(args.work, args.scaled), f"df_index_resolver x {args.scaled} ranks"))
        add_row(table, rows[-1])
    table.note(
        "seconds: wall (CPU of the tool's process tree); faster: HTA's wall over diag's; max diff: the largest "
        "|diag - HTA| over ranks of the idle, compute and non-compute shares and the overlap share, in "
        "percentage points, HTA with HTA_DISABLE_NS_ROUNDING=1; vs HTA rounding: against HTA's default"
    )
    table.save(args.json)
    if args.rows_json:
        args.rows_json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
