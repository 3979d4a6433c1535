"""Time from a planted hang to ``diag triage --watch``'s verdict, at diag's default capture settings.

Real 3-rank gloo jobs (tests/triage/hang_job.py) with the watchdog's defaults (heartbeat every 5 s, hang dump
after 120 s) and a collective timeout of 10 minutes (NCCL's default), each hanging one way: a rank whose data
loader blocks (loader), a rank that skips an all_reduce (skip), a rank that calls all_gather where the others
all_reduce (desync), a wait chain through a side group (chain). ``diag triage --watch`` (default --stall-s 20)
runs beside each job. The stall starts when the first rank enters the collective that never completes (its
``start_us`` in the heartbeats); the verdict when the watch prints it. Printed: per run the verdict, the
culprit and the seconds as it ends; then a table (``record.Table``, ``--json PATH`` saves it) of each
scenario's verdicts, culprits and seconds, with the median and the maximum.

    python benchmarks/bench_triage_watch.py --runs 2

Results and the command: docs/benchmarks.md ("diag triage --watch").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from record import Table, add_json_option  # noqa: E402

from diag.launch import start_ranks  # noqa: E402

HANG_JOB = REPO / "tests" / "triage" / "hang_job.py"
SCENARIOS = ("loader", "skip", "desync", "chain")
SCENARIO_LABELS = {
    "loader": "loader: rank 1's data loader blocks",
    "skip": "skip: rank 1 skips an all_reduce and finishes",
    "desync": "desync: rank 1 all_gathers where the others all_reduce",
    "chain": "chain: rank 2 blocks, rank 1 waits for it in a side group",
}
DEFAULTS = {"HANG_JOB_PG_TIMEOUT_S": "600", "HANG_JOB_THRESHOLD_S": "120", "HANG_JOB_HEARTBEAT_S": "5"}
RUN_DEADLINE_S = 180


def one_run(scenario: str, workdir: Path) -> dict:
    trace_dir = workdir / "trace"
    procs = start_ranks([str(HANG_JOB), scenario, str(trace_dir)], 3, DEFAULTS)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "diag", "triage", "--watch", "--format", "json", str(trace_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = watcher.communicate(timeout=RUN_DEADLINE_S)
        verdict_s = time.time()
        stall_start_s = _stall_start_s(trace_dir)
    finally:
        watcher.kill()
        for proc in procs:
            proc.kill()
            proc.communicate()
    verdict = json.loads(out) if out.strip() else {"verdict": "none", "culprit_ranks": []}
    return {
        "scenario": scenario,
        "verdict": verdict["verdict"],
        "culprits": verdict["culprit_ranks"],
        "stall_to_verdict_s": None if stall_start_s is None else verdict_s - stall_start_s,
    }


def _stall_start_s(trace_dir: Path) -> float | None:
    """When the first rank entered a collective that is still pending (from the ranks' last heartbeats); where
    none is pending because the ranks already failed (gloo ends a collective whose peer left the group with
    "Connection closed by peer": the skip scenario), when the first of them raised."""
    starts, raised = [], []
    for path in trace_dir.glob("rank*/heartbeat.json"):
        beat = json.loads(path.read_text())
        starts += [p["start_us"] / 1e6 for p in beat.get("pending", []) if p.get("start_us")]
        exit_record = beat.get("exit") or {}
        if exit_record.get("how") == "exception" and exit_record.get("time_us"):
            raised.append(exit_record["time_us"] / 1e6)
    return min(starts) if starts else min(raised) if raised else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each scenario")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    add_json_option(parser)
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        for scenario in args.scenarios.split(","):
            with tempfile.TemporaryDirectory(prefix="diag-watch-") as tmp:
                result = one_run(scenario, Path(tmp))
            results.append(result)
            seconds = result["stall_to_verdict_s"]
            print(
                f"{scenario:8s} -> {result['verdict']} {result['culprits']} "
                f"{'?' if seconds is None else f'{seconds:.1f} s'} after the stall began",
                flush=True,
            )
    print()
    table = Table("triage_watch", ["scenario", "verdict, culprits (each run)", "stall to verdict (s, each run)"])
    for scenario in args.scenarios.split(","):
        runs = [r for r in results if r["scenario"] == scenario]
        verdicts = sorted({f"`{r['verdict']}` {r['culprits']}" for r in runs})
        seconds = ["?" if r["stall_to_verdict_s"] is None else f"{r['stall_to_verdict_s']:.1f}" for r in runs]
        table.add(SCENARIO_LABELS.get(scenario, scenario), "; ".join(verdicts), ", ".join(seconds))
    times = [r["stall_to_verdict_s"] for r in results if r["stall_to_verdict_s"] is not None]
    if times:
        table.note(
            f"stall to verdict: median {statistics.median(times):.1f} s, max {max(times):.1f} s, {len(times)} runs"
        )
    if len(times) < len(results):
        table.note(f"{len(results) - len(times)} run(s) without a stall start in the heartbeats (?)")
    table.save(args.json)


if __name__ == "__main__":
    main()
