"""Fault-injection suite: how often diag names the right culprit, and how often it cries wolf.

Each run is a real multi-process gloo job (``benchmarks/fault_job.py``) that injects one fault at a random
rank and step (or none, for the healthy runs), then ``diag analyze`` (slow or failing jobs) or ``diag triage``
(hangs and desyncs) judges its traces. Printed: a confusion matrix of expected against given verdict, culprit
precision and recall, the false-alarm rate on healthy runs (any finding above ``low``), and the time from the
fault to the stall dump a verdict can be made from.

    python benchmarks/faults.py --runs 100 --seed 1 --ranks 4 --out faults.json

Results and the command: docs/benchmarks.md ("Fault injection").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diag.launch import start_ranks  # noqa: E402

FAULT_JOB = Path(__file__).with_name("fault_job.py")
PG_TIMEOUT_S = 6.0
HANG_THRESHOLD_S = 2.0
JOB_DEADLINE_S = 90.0  # no run outlives this
SEVERITY_ABOVE_LOW = ("medium", "high")
# Findings about the whole job's performance, not a fault: on this suite's jobs (4 ranks on 2 shared cores,
# gloo all_reduce at ~0.01 GB/s) exposed communication really is 20-60% of a step, so they are true on the
# healthy runs too. They are counted apart ("job_wide_findings"), not as false alarms.
JOB_WIDE_KINDS = ("communication", "low_mfu")


@dataclass(frozen=True)
class Fault:
    kind: str
    tool: str  # "analyze" or "triage": which command a user would reach for
    expected: str  # the verdict (triage) or the finding kind[:cause] (analyze) that is right
    models: tuple[str, ...] = ("manual",)
    culprit_is_pair: bool = False  # cross-group deadlock: the bad rank and its partner
    also_right: tuple[str, ...] = ()  # other verdicts that are as true (said why where used)


FAULTS = {
    f.kind: f
    for f in (
        Fault("healthy", "analyze", "none", ("ddp", "fsdp2", "manual")),
        Fault("compute", "analyze", "straggler:compute", ("ddp", "fsdp2", "manual")),
        Fault("data", "analyze", "straggler:data", ("ddp", "fsdp2", "manual")),
        # spikes every few steps: diag's name for that is a transient straggler
        Fault("intermittent", "analyze", "transient_straggler", models=("ddp", "manual"), also_right=("straggler",)),
        Fault("slow_comm", "analyze", "straggler", also_right=("transient_straggler",)),
        # filling the leaked memory slows that rank for real (10-17 ms a step in the 100-run suite): a straggler
        # whose cause is memory, on the leaking rank, is as true as the leak finding (which is in the report too)
        Fault("memory", "analyze", "memory_leak", ("ddp", "manual"), also_right=("straggler:memory",)),
        Fault("exception", "analyze", "crash", ("ddp", "manual")),
        Fault("late", "triage", "missing_ranks"),
        Fault("frozen", "triage", "missing_ranks"),
        Fault("sigkill", "triage", "dead_rank"),
        Fault("loader_hang", "triage", "missing_ranks"),
        Fault("barrier_hang", "triage", "missing_ranks"),
        Fault("desync_op", "triage", "desync"),
        Fault("desync_shape", "triage", "desync"),
        Fault("desync_dtype", "triage", "desync"),
        # gloo aborts the process that passes a different element count ("Fatal Python error: Aborted" inside
        # the all_reduce): dead_rank, naming it, is as true as desync
        Fault("desync_size", "triage", "desync", also_right=("dead_rank",)),
        Fault("cross_group", "triage", "deadlock", culprit_is_pair=True),
        # every rank entered the collective and none completed: no rank is missing, no culprit to name
        Fault("inside", "triage", "collective_hang"),
        Fault("preempted", "triage", "no_problem", ("ddp", "manual")),
    )
}


@dataclass
class Case:
    fault: str
    rank: int
    step: int
    model: str
    ranks: int

    @property
    def expected_culprits(self) -> list[int]:
        if self.fault in ("healthy", "preempted", "inside"):
            return []
        if FAULTS[self.fault].culprit_is_pair:
            return sorted({self.rank, (self.rank + 1) % self.ranks})
        return [self.rank]


@dataclass
class Judgement:
    given: str  # the verdict, or the finding kind (with a straggler's cause)
    culprits: list[int]
    alarms: list[str] = field(default_factory=list)  # findings above low that claim a fault
    job_wide: list[str] = field(default_factory=list)  # JOB_WIDE_KINDS findings above low


@dataclass
class Outcome:
    case: Case
    expected: str
    given: str
    culprits: list[int]
    verdict_right: bool
    culprit_right: bool
    false_alarms: list[str] = field(default_factory=list)  # findings above low on a healthy run
    job_wide: list[str] = field(default_factory=list)  # JOB_WIDE_KINDS findings above low on a healthy run
    fault_to_dump_s: float | None = None  # fault injected -> first stall dump (what triage judges from)
    judge_s: float = 0.0  # the diag command's own time
    run_s: float = 0.0
    error: str | None = None


def draw_cases(n: int, seed: int, ranks: int, kinds: list[str]) -> list[Case]:
    """Every fault kind in turn (healthy runs twice as often, for false alarms), at a random rank and step."""
    rng = random.Random(seed)
    order = [k for k in kinds for _ in range(2 if k == "healthy" else 1)]
    cases = []
    for i in range(n):
        kind = order[i % len(order)]
        fault = FAULTS[kind]
        cases.append(Case(kind, rng.randrange(ranks), rng.randint(2, 4), rng.choice(fault.models), ranks))
    return cases


def run_case(case: Case, workdir: Path) -> Outcome:
    start = time.monotonic()
    trace_dir = workdir / "trace"
    env = {
        "FAULT_KIND": case.fault,
        "FAULT_RANK": str(case.rank),
        "FAULT_STEP": str(case.step),
        "FAULT_MODEL": case.model,
        "FAULT_PG_TIMEOUT_S": str(PG_TIMEOUT_S),
        "FAULT_HANG_THRESHOLD_S": str(HANG_THRESHOLD_S),
        "FAULT_STEPS": "40" if case.fault == "preempted" else "14",
        "PYTHONWARNINGS": "ignore",
    }
    procs = start_ranks([str(FAULT_JOB), str(trace_dir)], case.ranks, env)
    try:
        _drive(case, procs, trace_dir)
    finally:
        _end_all(procs)
    fault = FAULTS[case.fault]
    judge_start = time.monotonic()
    try:
        judged = _judge_analyze(trace_dir) if fault.tool == "analyze" else _judge_triage(trace_dir)
        error = None
    except Exception as exc:  # a crash of diag itself is a wrong verdict, and said so
        judged, error = Judgement("error", []), f"{type(exc).__name__}: {exc}"
    judge_s = time.monotonic() - judge_start
    given = judged.given
    verdict_right = is_right(fault, given)
    healthy = case.fault == "healthy"
    return Outcome(
        case=case,
        expected=fault.expected,
        given=given,
        culprits=judged.culprits,
        verdict_right=verdict_right,
        culprit_right=judged.culprits == case.expected_culprits,
        false_alarms=judged.alarms if healthy else [],
        job_wide=judged.job_wide if healthy else [],
        fault_to_dump_s=_fault_to_dump_s(trace_dir) if fault.tool == "triage" else None,
        judge_s=judge_s,
        run_s=time.monotonic() - start,
        error=error,
    )


def is_right(fault: Fault, given: str) -> bool:
    """The given verdict is the expected one, or as true (``also_right``); "straggler" matches any cause."""
    return any(given == want or given.startswith(want + ":") for want in (fault.expected, *fault.also_right))


def rescore(path: Path, kept: Path | None = None) -> list[Outcome]:
    """Outcomes of an earlier --out file judged again with today's expectations (the runs are not repeated);
    given the traces that run kept (``--keep``), also with today's diag: each run's traces are judged anew."""
    outcomes = []
    for i, raw in enumerate(json.loads(path.read_text())["runs"]):
        case = Case(**raw.pop("case"))
        outcome = Outcome(case=case, **raw)
        fault = FAULTS[case.fault]
        if kept is not None:
            trace_dir = kept / f"{i:03d}-{case.fault}"
            judged = _judge_analyze(trace_dir) if fault.tool == "analyze" else _judge_triage(trace_dir)
            outcome.given, outcome.culprits = judged.given, judged.culprits
            outcome.culprit_right = judged.culprits == case.expected_culprits
            healthy = case.fault == "healthy"
            outcome.false_alarms = judged.alarms if healthy else []
            outcome.job_wide = judged.job_wide if healthy else []
        outcome.expected = fault.expected
        outcome.verdict_right = is_right(fault, outcome.given)
        outcomes.append(outcome)
    return outcomes


def _drive(case: Case, procs: list[subprocess.Popen], trace_dir: Path) -> None:
    """Act where the job asks (SIGSTOP/SIGCONT, SIGKILL); end a hung job as a launcher would after the timeout."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    bad = procs[case.rank]
    stopped_at = None
    first_stall = None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        ready = (trace_dir / "ready").exists()
        if ready and case.fault == "sigkill" and bad.poll() is None:
            time.sleep(0.3)
            bad.send_signal(signal.SIGKILL)
        if ready and case.fault == "preempted":
            time.sleep(0.5)
            for proc in procs:  # what Slurm or Kubernetes does to every rank of a preempted job
                proc.send_signal(signal.SIGTERM)
            return
        if ready and case.fault in ("frozen", "inside") and stopped_at is None:
            time.sleep(0.5 if case.fault == "inside" else 0)  # let it get into the all_reduce
            bad.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() > stopped_at + PG_TIMEOUT_S + 5:
            bad.send_signal(signal.SIGCONT)
            stopped_at = float("inf")
        if first_stall is None and any(trace_dir.glob("rank*/hang_dump_*.json")):
            first_stall = time.monotonic()
        if first_stall is not None and time.monotonic() > first_stall + PG_TIMEOUT_S + 8:
            for proc in procs:  # past the timeout: what a launcher does to what is left of a failed job
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.1)


def _end_all(procs: list[subprocess.Popen]) -> None:
    grace_end = time.monotonic() + 10
    while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    for proc in procs:
        proc.communicate()


def _diag_json(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "diag", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output")
    return json.loads(result.stdout)


def _judge_analyze(trace_dir: Path) -> Judgement:
    """The verdict is the first finding (they are ranked by cost, failures first) that names particular ranks;
    its kind, with a straggler's cause, and its ranks. Findings above low are kept for the false-alarm rate."""
    report = _diag_json("analyze", str(trace_dir), "--no-cache")
    findings = report.get("findings", [])
    world = set(report.get("run", {}).get("ranks_found") or [])
    above_low = [f"{f['kind']}[{f['severity']}]" for f in findings if f.get("severity") in SEVERITY_ABOVE_LOW]
    alarms = [a for a in above_low if a.split("[")[0] not in JOB_WIDE_KINDS]
    job_wide = [a for a in above_low if a.split("[")[0] in JOB_WIDE_KINDS]
    for finding in findings:
        kind, ranks = finding["kind"], sorted(finding.get("ranks") or [])
        if finding.get("severity") not in SEVERITY_ABOVE_LOW:
            continue
        if kind in ("crash", "step_error"):  # every rank may have raised; the first error is the cause
            errors = report.get("run", {}).get("step_errors") or []
            return Judgement("crash", [int(errors[0]["rank"])] if errors else ranks, alarms, job_wide)
        if not ranks or set(ranks) == world:
            continue
        if kind == "straggler":
            cause = _straggler_cause(finding.get("title", ""))
            return Judgement(f"straggler:{cause}", ranks, alarms, job_wide)
        return Judgement(kind, ranks, alarms, job_wide)
    return Judgement("none", [], alarms, job_wide)


def _straggler_cause(title: str) -> str:
    """'Rank 1 is a persistent straggler (compute): ...' -> compute."""
    if "(" in title and ")" in title:
        return title.split("(", 1)[1].split(")", 1)[0].strip() or "unknown"
    return "unknown"


def _judge_triage(trace_dir: Path) -> Judgement:
    verdict = _diag_json("triage", str(trace_dir))
    return Judgement(str(verdict.get("verdict")), sorted(int(r) for r in verdict.get("culprit_ranks") or []))


def _fault_to_dump_s(trace_dir: Path) -> float | None:
    try:
        fault_at = json.loads((trace_dir / "fault_at.json").read_text())["time_s"]
    except (OSError, ValueError, KeyError):
        return None
    dumps = [p.stat().st_mtime for p in trace_dir.glob("rank*/hang_dump_*.json")]
    return (min(dumps) - fault_at) if dumps else None


def summarize(outcomes: list[Outcome]) -> dict:
    faulty = [o for o in outcomes if o.case.fault != "healthy"]
    healthy = [o for o in outcomes if o.case.fault == "healthy"]
    given_total = sum(len(o.culprits) for o in outcomes)
    expected_total = sum(len(o.case.expected_culprits) for o in faulty)
    hits = sum(len(set(o.culprits) & set(o.case.expected_culprits)) for o in outcomes)
    delays = [o.fault_to_dump_s for o in outcomes if o.fault_to_dump_s is not None]
    return {
        "runs": len(outcomes),
        "verdict_accuracy": sum(o.verdict_right for o in outcomes) / len(outcomes) if outcomes else None,
        "culprit_accuracy": sum(o.culprit_right for o in faulty) / len(faulty) if faulty else None,
        "culprit_precision": hits / given_total if given_total else None,
        "culprit_recall": hits / expected_total if expected_total else None,
        "healthy_runs": len(healthy),
        "false_alarm_rate": sum(bool(o.false_alarms) for o in healthy) / len(healthy) if healthy else None,
        "false_alarm_kinds": dict(Counter(a for o in healthy for a in o.false_alarms)),
        "job_wide_findings_on_healthy_runs": dict(Counter(a for o in healthy for a in o.job_wide)),
        "fault_to_dump_s_median": statistics.median(delays) if delays else None,
        "fault_to_dump_s_max": max(delays) if delays else None,
        "judge_s_median": statistics.median(o.judge_s for o in outcomes) if outcomes else None,
    }


def print_report(outcomes: list[Outcome], summary: dict) -> None:
    matrix: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        matrix[f"{o.case.fault} (want {o.expected})"][o.given] += 1
    givens = sorted({o.given for o in outcomes})
    width = max(len(r) for r in matrix) + 2
    print("\nConfusion matrix: fault (expected verdict) x verdict given")
    print(" " * width + "  ".join(f"{g[:18]:>18}" for g in givens))
    for row in sorted(matrix):
        print(f"{row:<{width}}" + "  ".join(f"{matrix[row].get(g, 0):>18}" for g in givens))
    print("\nPer fault: runs, right verdict, right culprit")
    for kind in FAULTS:
        mine = [o for o in outcomes if o.case.fault == kind]
        if mine:
            print(
                f"  {kind:<14} {len(mine):>3}  verdict {sum(o.verdict_right for o in mine):>3}"
                f"  culprit {sum(o.culprit_right for o in mine):>3}"
            )
    wrong = [o for o in outcomes if not (o.verdict_right and o.culprit_right)]
    if wrong:
        print("\nWrong runs:")
        for o in wrong:
            c = o.case
            print(
                f"  {c.fault} rank {c.rank} step {c.step} {c.model}: gave {o.given} {o.culprits}, "
                f"wanted {o.expected} {c.expected_culprits}" + (f" ({o.error})" if o.error else "")
            )
    print("\nSummary")
    for key, value in summary.items():
        print(f"  {key}: {round(value, 4) if isinstance(value, float) else value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=len(FAULTS) + 1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated fault kinds to draw from")
    parser.add_argument("--out", type=Path, help="write every outcome and the summary as JSON")
    parser.add_argument("--keep", type=Path, help="keep each run's traces under this directory")
    parser.add_argument("--rescore", type=Path, help="judge an earlier --out file again, without running jobs")
    parser.add_argument("--rejudge", type=Path, help="with --rescore: that run's --keep directory, judged anew")
    args = parser.parse_args(argv)
    if args.rescore:
        outcomes = rescore(args.rescore, args.rejudge)
        print_report(outcomes, summarize(outcomes))
        return 0
    kinds = [k for k in args.faults.split(",") if k]
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    cases = draw_cases(args.runs, args.seed, args.ranks, kinds)
    print(f"{len(cases)} runs, seed {args.seed}, {args.ranks} ranks", flush=True)
    outcomes = []
    for i, case in enumerate(cases):
        with tempfile.TemporaryDirectory(prefix="diag-fault-") as tmp:
            outcome = run_case(case, Path(tmp))
            if args.keep and (Path(tmp) / "trace").is_dir():  # a job that died before diag.init wrote none
                shutil.copytree(Path(tmp) / "trace", args.keep / f"{i:03d}-{case.fault}", dirs_exist_ok=True)
        outcomes.append(outcome)
        mark = "ok " if outcome.verdict_right and outcome.culprit_right else "BAD"
        print(
            f"[{i + 1:>3}/{len(cases)}] {mark} {case.fault:<13} rank {case.rank} step {case.step} {case.model:<6}"
            f" -> {outcome.given} {outcome.culprits} ({outcome.run_s:.0f} s)",
            flush=True,
        )
    summary = summarize(outcomes)
    print_report(outcomes, summary)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": [asdict(o) for o in outcomes]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
