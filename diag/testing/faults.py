"""Fault-injection suite: how often diag names the right fault and culprit on the jobs users write, and how often
it cries wolf.

Each run is a scenario drawn from a seed: a real multi-process gloo job (``diag/testing/fault_job.py``) of some
shape (the exception propagates; caught then ``diag.finish()``; ``finally``; ``sys.exit`` in the handler;
log-and-continue; ``diag.Trainer``; FSDP2; an elastic restart into the same directory; Lightning, the HF
Trainer, DeepSpeed; a pipeline schedule; a dp x tp device mesh), with compute that is a sleep or real matmuls,
at a world size of 2, 3, 4 or 8 (a mesh: 4 or 8), injecting one fault kind where it strikes (the data
loader, forward, backward, optimizer step, inside a collective, or at step 0), beside no load or 1x / 2x the
cores in CPU burners. ``diag analyze`` (slow or failing jobs) or ``diag triage`` (hangs and desyncs) then judges
its traces as a user would. The expected verdict of a fault does not depend on the job's shape: a caught error
is judged as the same error left to propagate.

    python -m diag.testing.faults --runs 300 --seed 2811 --out faults.json      # fresh runs
    python -m diag.testing.faults --resume faults.json                          # continue a partial file
    python -m diag.testing.faults --table faults.json [more.json ...]           # markdown tables
    python -m diag.testing.faults --compare-pairs 20 --seed 2811 --out aa.json  # same job twice: diag compare
    python -m diag.testing.faults --rejudge faults.json kept/                   # kept traces, today's diag

Reported: the confusion matrix of expected against given verdict, verdict and culprit accuracy per value of
every dimension, false alarms on healthy runs per load level (any finding above ``low`` naming ranks), and the
time from the fault to the stall dump and to the verdict. Results and the command: docs/benchmarks.md
("Fault injection").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
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

from diag.launch import start_ranks

FAULT_JOB = Path(__file__).with_name("fault_job.py")
PG_TIMEOUT_S = 6.0
HANG_THRESHOLD_S = 2.0
JOB_DEADLINE_S = 300.0  # no attempt outlives this (starting 8 ranks on a loaded 2-core box takes minutes)
RESTART_STEPS = 6  # the elastic restart's attempt: a short healthy run into the same directory
SEVERITY_ABOVE_LOW = ("medium", "high")
# Findings about the whole job's performance, not a fault: on these jobs (up to 8 ranks on 2 shared cores, gloo
# all_reduce at ~0.01 GB/s) exposed communication really is a large share of a step, so they are true on the
# healthy runs too. They are counted apart ("job_wide_findings"), not as false alarms.
JOB_WIDE_KINDS = ("communication", "low_mfu")

SHAPES = (
    "propagate",
    "caught_finish",
    "finally",
    "sys_exit",
    "log_continue",
    "trainer",
    "fsdp2",
    "elastic",
    "lightning",
    "hf_trainer",
    "deepspeed",
    "pipeline",
    "mesh",
)
MESH_TP = 2  # fault_job.py's tensor-parallel degree: a mesh job's world is a multiple of it, dp of 2 or more
COMPUTES = ("sleep", "matmul")
WORLDS = (2, 3, 4, 8)
LOADS = ("none", "1x", "2x")  # CPU burners beside the job: none, one or two per core
DIMENSIONS = ("shape", "compute", "world", "kind", "where", "load")
NO_WHERE = "-"


@dataclass(frozen=True)
class Fault:
    kind: str
    wheres: tuple[str, ...]  # where it can strike; step0 is the forward of step 0
    culprit_is_pair: bool = False  # cross-group deadlock: the bad rank and its partner
    weight: int = 1  # drawn this many times as often as a weight-1 kind

    def expected(self, where: str) -> tuple[str, str, tuple[str, ...]]:
        """(tool, verdict, other verdicts as true) for this fault striking at ``where``."""
        return EXPECTED[self.kind](where)


def _straggler(where: str):
    if where == "data":
        return "analyze", "straggler:data", ()
    if where == "collective":  # host work just before the collective: late into it, whatever diag calls it
        return "analyze", "straggler", ("transient_straggler",)
    return "analyze", "straggler:compute", ()


def _hang(where: str):
    if where == "collective":  # every rank entered the collective and none completed: no rank is missing
        return "triage", "collective_hang", ()
    return "triage", "missing_ranks", ()


EXPECTED = {
    "healthy": lambda where: ("analyze", "none", ()),
    "straggler": _straggler,
    # spikes every few steps: diag's name for that is a transient straggler
    "intermittent": lambda where: ("analyze", "transient_straggler", ("straggler",)),
    # filling the leaked memory slows that rank for real: a straggler whose cause is memory, on the leaking
    # rank, is as true as the leak finding
    "memory": lambda where: ("analyze", "memory_leak", ("straggler:memory",)),
    "exception": lambda where: ("analyze", "crash", ()),
    "hang": _hang,
    "frozen": _hang,
    "sigkill": lambda where: ("triage", "dead_rank", ()),
    "desync": lambda where: ("triage", "desync", ()),
    "cross_group": lambda where: ("triage", "deadlock", ()),
    "preempted": lambda where: ("triage", "no_problem", ()),
}
# diag/triage/action.py's answers: the job's own error; the job's own code kept a rank away (it computed past
# the timeout, or its data loader never answered); a process the node froze (SIGSTOPped: its watchdog could not
# dump); a rank killed without an error of its own; ranks disagreeing on the collectives
EXPECTED_ACTIONS = {
    "exception": "fix_code",
    "hang": "fix_code",
    "frozen": "evict",
    "sigkill": "restart",
    "desync": "fix_code",
    "cross_group": "fix_code",
    "preempted": "none",
}
# no failure is injected: a rank waiting past the hang threshold is slowness, and the job ends on its own
RUNS_TO_ITS_END = ("healthy", "straggler", "intermittent", "memory")
PIPELINE_WORK = ("forward", "backward", "step0", "optimizer")  # a pipeline stage's own compute
DESYNCS = ("op", "shape", "dtype")  # all_gather against all_reduce; 4x3 against 12; float64 against float32
_ALL = ("data", "forward", "backward", "optimizer", "collective", "step0")
# the shapes whose loop is fault_job.train(): their "between" strike point runs after each step, outside it
BETWEEN_SHAPES = ("propagate", "caught_finish", "finally", "sys_exit", "fsdp2", "elastic", "mesh")
BETWEEN_SEED = 0xB7
FAULTS = {
    f.kind: f
    for f in (
        Fault("healthy", (NO_WHERE,), weight=2),
        Fault("straggler", _ALL),
        Fault("intermittent", ("data", "forward", "backward", "optimizer")),
        Fault("memory", ("forward", "backward", "optimizer")),
        # between: after a step, outside diag.step (an evaluation or checkpoint hook), in the plain loops only
        Fault("exception", ("data", "forward", "backward", "optimizer", "step0", "between")),
        Fault("hang", _ALL),
        Fault("frozen", ("forward", "backward", "optimizer", "collective", "step0")),
        Fault("sigkill", _ALL),
        # one kind with variants (DESYNCS, in turn), so that collective-only kinds do not crowd out the others
        Fault("desync", ("collective",)),
        Fault("cross_group", ("collective",), culprit_is_pair=True),
        Fault("preempted", (NO_WHERE,)),
    )
}


@dataclass
class Scenario:
    shape: str
    compute: str
    world: int
    kind: str
    where: str
    load: str
    rank: int
    step: int
    variant: str = ""  # desync: which of DESYNCS

    @property
    def fault(self) -> Fault:
        return FAULTS[self.kind]

    def expectation(self) -> tuple[str, str, tuple[str, ...]]:
        """(tool, verdict, other verdicts as true) for this scenario."""
        if self.shape == "deepspeed" and self.kind in ("hang", "frozen") and self.where in ("backward", "optimizer"):
            # ZeRO's process groups come from new_group without a timeout, and torch gives those the backend's
            # default (30 min for gloo), not the job's: a stall before their next collective ends in time, the
            # job only ran slow, and the stalled rank is the slowest. A stall in the forward (step0 included)
            # keeps the others in the forward's own all_reduce on the default group, whose timeout is the job's.
            return "triage", "slow", ()
        if self.shape == "pipeline" and self.kind == "straggler" and self.where in PIPELINE_WORK:
            # a stage that computes longer (in the schedule or its own optimizer step) sets the whole
            # pipeline's pace: diag's bubble finding names it; stragglers compare stages only on what is alike
            return "analyze", "pipeline_bubble", ("straggler",)
        if self.shape == "pipeline" and self.kind == "memory":
            # filling the leaked memory is real work in the leaking stage (5 ms a step, 13% more in one run):
            # the bubble finding naming that stage is as true as straggler:memory is in data parallelism
            tool, verdict, also = self.fault.expected(self.where)
            return tool, verdict, (*also, "pipeline_bubble")
        return self.fault.expected(self.where)

    @property
    def expected_action(self) -> str | None:
        """What `diag triage` should say to do (its JSON's ``action``), for every kind: the runs `diag analyze`
        judges are asked too (a user who sees a job fail or crawl reaches for both). A crash is the code's; a
        job that is only slow, leaks or is healthy has nothing to act on."""
        if self.kind == "exception":
            return EXPECTED_ACTIONS[self.kind]
        if self.tool != "triage":
            return "none"
        if self.expected in ("slow", "no_problem"):
            return "none"
        if self.expected == "collective_hang":  # every member entered: the network's, not the code's
            return "restart"
        return EXPECTED_ACTIONS[self.kind]

    @property
    def tool(self) -> str:
        return self.expectation()[0]

    @property
    def expected(self) -> str:
        return self.expectation()[1]

    @property
    def expected_culprits(self) -> list[int]:
        if self.kind in ("healthy", "preempted") or self.expected == "collective_hang":
            return []
        if self.fault.culprit_is_pair:
            return sorted({self.rank, (self.rank + 1) % self.world})
        return [self.rank]

    def label(self) -> str:
        kind = f"{self.kind}_{self.variant}" if self.variant else self.kind
        return (
            f"{kind}@{self.where} {self.shape} {self.compute} w{self.world} load {self.load} r{self.rank} s{self.step}"
        )

    def job_env(self) -> dict[str, str]:
        where, step = ("forward", 0) if self.where == "step0" else (self.where, self.step)
        return {
            "FAULT_KIND": f"{self.kind}_{self.variant}" if self.variant else self.kind,
            "FAULT_WHERE": where if where != NO_WHERE else "forward",
            "FAULT_RANK": str(self.rank),
            "FAULT_STEP": str(step),
            "FAULT_SHAPE": self.shape,
            "FAULT_COMPUTE": self.compute,
            "FAULT_PG_TIMEOUT_S": str(PG_TIMEOUT_S),
            "FAULT_HANG_THRESHOLD_S": str(HANG_THRESHOLD_S),
            "FAULT_STEPS": "40" if self.kind == "preempted" else "14",
            "PYTHONWARNINGS": "ignore",
        }


@dataclass
class Judgement:
    given: str  # the verdict, or the finding kind (with a straggler's cause)
    culprits: list[int]
    alarms: list[str] = field(default_factory=list)  # findings above low that claim a fault
    job_wide: list[str] = field(default_factory=list)  # JOB_WIDE_KINDS findings above low
    action: str | None = None  # diag triage's: fix_code, restart, evict, none


@dataclass
class Outcome:
    scenario: Scenario
    expected: str
    given: str
    culprits: list[int]
    verdict_right: bool
    culprit_right: bool
    false_alarms: list[str] = field(default_factory=list)  # findings above low on a healthy run
    job_wide: list[str] = field(default_factory=list)  # JOB_WIDE_KINDS findings above low on a healthy run
    fault_to_dump_s: float | None = None  # fault injected -> first stall dump (what triage judges from)
    fault_to_verdict_s: float | None = None  # fault injected -> the verdict printed
    judge_s: float = 0.0  # the diag command's own time
    run_s: float = 0.0
    restarted: bool = False  # elastic: a second attempt ran into the same directory
    ran: bool = True  # False: the suite's deadline ended the job (too slow to start or reach its fault here)
    error: str | None = None
    load_average_1m: float | None = None  # the machine's at the job's end, burners and whatever else ran beside
    action: str | None = None  # what diag triage said to do (None: judged by diag analyze)
    action_right: bool | None = None


# -- drawing scenarios ----------------------------------------------------------------------------------------


def _stratified(rng: random.Random, values, n: int) -> list:
    """``n`` values in which each of ``values`` appears ``n // len(values)`` or one more times (which ones once
    more is drawn too, so a short run does not always take the first values), shuffled."""
    order = rng.sample(list(values), len(values))
    out = [order[i % len(order)] for i in range(n)]
    rng.shuffle(out)
    return out


def draw_scenarios(
    n: int,
    seed: int,
    shapes=SHAPES,
    computes=COMPUTES,
    worlds=WORLDS,
    kinds=tuple(FAULTS),
    loads=LOADS,
    wheres: tuple[str, ...] | None = None,
) -> list[Scenario]:
    """``n`` scenarios from ``seed``: every dimension stratified (each value as often as the others, healthy
    runs twice as often for the false-alarm rate, each kind's strike points in turn), combined at random.
    ``wheres``: only these strike points (each scenario's drawn from those its kind and shape allow)."""
    rng = random.Random(seed)
    weighted = [k for k in kinds for _ in range(FAULTS[k].weight)]
    columns = {
        "shape": _stratified(rng, list(shapes), n),
        "compute": _stratified(rng, list(computes), n),
        "world": _stratified(rng, list(worlds), n),
        "kind": _stratified(rng, weighted, n),
        "load": _stratified(rng, list(loads), n),
    }
    places: list[str] = []  # strike points, in shuffled rounds of all of them: each as often as the others
    desyncs = rng.randrange(len(DESYNCS))
    between = random.Random(seed ^ BETWEEN_SEED)  # its own stream: a seed's other draws stay as they were
    scenarios = []
    for i in range(n):
        kind = columns["kind"][i]
        where = _next_place(rng, places, FAULTS[kind].wheres)
        allowed = FAULTS[kind].wheres
        shape = columns["shape"][i]
        if "between" in allowed and shape in BETWEEN_SHAPES and between.random() < 1 / len(allowed):
            where = "between"
        if wheres is not None and where not in wheres:
            choices = [w for w in allowed if w in wheres and (w != "between" or shape in BETWEEN_SHAPES)]
            if not choices:
                raise SystemExit(f"{kind} in the {shape} shape strikes at none of {', '.join(wheres)}")
            where = between.choice(choices)
        world = columns["world"][i]
        if columns["shape"][i] == "mesh" and (world % MESH_TP or world < 2 * MESH_TP):
            world = 2 * MESH_TP  # a device mesh of two dimensions, each of 2 or more
        step = 0 if where == "step0" else rng.randint(2, 4)
        variant = DESYNCS[desyncs % len(DESYNCS)] if kind == "desync" else ""
        desyncs += kind == "desync"
        scenarios.append(
            Scenario(
                columns["shape"][i], columns["compute"][i], world, kind, where, columns["load"][i],
                rng.randrange(world), step, variant,
            )
        )  # fmt: skip
    return scenarios


def _next_place(rng: random.Random, places: list[str], allowed: tuple[str, ...]) -> str:
    """The first of ``places`` (the rounds still to hand out) that the fault can strike at, taken out of it
    (a collective-only fault takes its collective from the rounds too, so that no place is drawn more often)."""
    if allowed == (NO_WHERE,):
        return NO_WHERE
    while True:
        for index, place in enumerate(places):
            if place in allowed:
                return places.pop(index)
        places.extend(rng.sample(_ALL, len(_ALL)))


# -- load beside the job --------------------------------------------------------------------------------------


@contextlib.contextmanager
def burners(load: str):
    """CPU burners (a busy loop each, one or two per core), each in its own process group, always stopped;
    yields their processes."""
    count = {"none": 0, "1x": 1, "2x": 2}[load] * (os.cpu_count() or 1)
    procs = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            )  # fmt: skip
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()


# -- one run --------------------------------------------------------------------------------------------------


def prepare(shapes) -> None:
    """Build what a shape compiles on its first use on a machine (DeepSpeed's shared-memory comm op on CPU
    takes minutes to compile under load), once, before any run, so that no run's time includes it."""
    if "deepspeed" in shapes:
        build = "from deepspeed.accelerator import get_accelerator as g; g().create_op_builder('ShareMemCommBuilder').load()"
        subprocess.run([sys.executable, "-c", build], env={**os.environ, "DS_ACCELERATOR": "cpu"}, check=True)


def run_job(scenario: Scenario, trace_dir: Path, env_extra: dict | None = None) -> tuple[list[int | None], float, bool]:
    """One attempt of the job; returns every rank's exit code, the wall time when the attempt ended and whether
    the suite's deadline ended it."""
    env = {**scenario.job_env(), **(env_extra or {})}
    procs = start_ranks([str(FAULT_JOB), str(trace_dir)], scenario.world, env)
    try:
        past_deadline = _drive(scenario, procs, trace_dir, acting=not env_extra)
    finally:
        outputs = _end_all(procs)
        attempt = (env_extra or {}).get("FAULT_ATTEMPT", "0")
        for rank, (stdout, stderr) in enumerate(outputs):  # beside the traces: what --keep keeps with them
            (trace_dir.parent / f"attempt{attempt}-rank{rank}.log").write_text(stdout[-20000:] + stderr[-20000:])
    return [p.returncode for p in procs], time.time(), past_deadline


def run_case(scenario: Scenario, workdir: Path) -> Outcome:
    start = time.monotonic()
    trace_dir = workdir / "trace"
    restarted = False
    with burners(scenario.load):
        codes, ended_at, past_deadline = run_job(scenario, trace_dir)
        if scenario.shape == "elastic" and any(code != 0 for code in codes):
            # what torchrun --max-restarts does after a failed attempt: every rank again, same directory
            restart = {"FAULT_ATTEMPT": "1", "TORCHELASTIC_RESTART_COUNT": "1", "FAULT_STEPS": str(RESTART_STEPS)}
            run_job(scenario, trace_dir, restart)
            restarted = True
        load_average_1m = os.getloadavg()[0]
    # the harness's failure, not diag's, counted apart: no rank reached diag.init (a framework may have made the
    # directory for its own output before its start-up timed out on the loaded box)
    if past_deadline or not any(trace_dir.glob("rank*")):
        why = (
            f"the suite's deadline ({JOB_DEADLINE_S:.0f} s) ended the job"
            if past_deadline
            else f"the job wrote no trace directory: no rank reached diag.init (rank 0 said: "
            f"{_last_line(workdir / 'attempt0-rank0.log')})"
        )
        return Outcome(scenario, scenario.expected, "not_run", [], False, False, run_s=time.monotonic() - start,
                       error=why, ran=False, load_average_1m=load_average_1m)  # fmt: skip
    judge_start = time.monotonic()
    judged, error = judge(scenario, trace_dir)
    judge_s = time.monotonic() - judge_start
    fault_at = _fault_at(trace_dir)
    to_dump = _fault_to_dump_s(trace_dir, fault_at) if scenario.tool == "triage" else None
    evidence_s = to_dump if to_dump is not None else (ended_at - fault_at if fault_at is not None else None)
    healthy = scenario.kind == "healthy"
    return Outcome(
        scenario=scenario,
        expected=scenario.expected,
        given=judged.given,
        culprits=judged.culprits,
        verdict_right=is_right(scenario, judged.given),
        culprit_right=judged.culprits == scenario.expected_culprits,
        action=judged.action,
        action_right=None if scenario.expected_action is None else judged.action == scenario.expected_action,
        false_alarms=judged.alarms if healthy else [],
        job_wide=judged.job_wide if healthy else [],
        fault_to_dump_s=to_dump,
        fault_to_verdict_s=evidence_s + judge_s if evidence_s is not None and error is None else None,
        judge_s=judge_s,
        run_s=time.monotonic() - start,
        restarted=restarted,
        error=error,
        load_average_1m=load_average_1m,
    )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][:200] if lines else "no output"


def judge(scenario: Scenario, trace_dir: Path) -> tuple[Judgement, str | None]:
    """What the diag command a user would reach for says of this run's traces."""
    try:
        judged = _judge_analyze(trace_dir) if scenario.tool == "analyze" else _judge_triage(trace_dir)
        if scenario.tool == "analyze" and scenario.expected_action is not None:
            judged.action = _judge_triage(trace_dir).action
        return judged, None
    except Exception as exc:  # a crash of diag itself is a wrong verdict, and said so
        return Judgement("error", []), f"{type(exc).__name__}: {exc}"


def rejudge(results: Path, kept: Path) -> list[Outcome]:
    """The runs of a results file judged again by today's diag from the traces its --keep directory holds:
    for working on diag between fresh runs (the jobs are not run again; its figures are not fresh runs')."""
    _, outcomes, _ = load_results(results)
    for index, o in enumerate(outcomes):
        judged, o.error = judge(o.scenario, kept / f"{index:03d}-{o.scenario.kind}" / "trace")
        healthy = o.scenario.kind == "healthy"
        o.expected, o.given, o.culprits = o.scenario.expected, judged.given, judged.culprits
        o.verdict_right = is_right(o.scenario, judged.given)
        o.culprit_right = judged.culprits == o.scenario.expected_culprits
        o.action = judged.action
        o.action_right = None if o.scenario.expected_action is None else judged.action == o.scenario.expected_action
        o.false_alarms, o.job_wide = (judged.alarms, judged.job_wide) if healthy else ([], [])
    return outcomes


def is_right(scenario: Scenario, given: str) -> bool:
    """The given verdict is the expected one, or as true; "straggler" matches any cause."""
    _, want, also = scenario.expectation()
    return any(given == w or given.startswith(w + ":") for w in (want, *also))


def _drive(scenario: Scenario, procs: list[subprocess.Popen], trace_dir: Path, acting: bool = True) -> bool:
    """Act where the job asks (SIGSTOP/SIGCONT, SIGKILL, SIGTERM); end a hung job as a launcher would after the
    timeout (not a slow one: RUNS_TO_ITS_END). True when the suite's own deadline ended the job instead (the
    scenario did not play out)."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    started_s = time.time()  # a restart writes into the directory of the attempt before: its dumps are older
    bad = procs[scenario.rank]
    kind, inside = scenario.kind, scenario.where == "collective"
    stopped_at = None
    first_stall = None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        ready = acting and (trace_dir / "ready").exists()
        if ready and kind == "sigkill" and bad.poll() is None and not inside:
            time.sleep(0.3)
            bad.send_signal(signal.SIGKILL)
        if ready and kind == "sigkill" and bad.poll() is None and inside:
            # killed inside the collective once the others wait in it too (their stall dumps say so): held
            # (SIGSTOP) in it until then, so that it neither completes nor leaves a rank that enters late
            if stopped_at is None:
                time.sleep(0.5)
                bad.send_signal(signal.SIGSTOP)
                stopped_at = time.monotonic()
            elif _others_stalled(trace_dir, scenario) or time.monotonic() > stopped_at + PG_TIMEOUT_S - 1:
                bad.send_signal(signal.SIGKILL)
        if ready and kind == "preempted":
            time.sleep(0.5)
            for proc in procs:  # what Slurm or Kubernetes does to every rank of a preempted job
                proc.send_signal(signal.SIGTERM)
            return False
        if ready and kind in ("frozen", "hang") and stopped_at is None and (kind == "frozen" or inside):
            time.sleep(0.5 if inside else 0)  # let it get into the all_reduce
            bad.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
        if kind != "sigkill" and stopped_at is not None and time.monotonic() > stopped_at + PG_TIMEOUT_S + 5:
            bad.send_signal(signal.SIGCONT)
            stopped_at = float("inf")
        if first_stall is None and _dumped_since(trace_dir, started_s):
            first_stall = time.monotonic()
        ended_as_failed = first_stall is not None and kind not in RUNS_TO_ITS_END
        if ended_as_failed and time.monotonic() > first_stall + PG_TIMEOUT_S + 8:
            for proc in procs:  # past the timeout: what a launcher does to what is left of a failed job
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            return False
        time.sleep(0.1)
    return any(p.poll() is None for p in procs)


def _dumped_since(trace_dir: Path, since_s: float) -> bool:
    """A rank wrote a hang dump since ``since_s`` (this attempt's, not an earlier attempt's into the same
    directory: taken for this one's, it ended a healthy restart as a failed job 14 s in)."""
    for path in trace_dir.glob("rank*/hang_dump_*.json"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime >= since_s:
                return True
    return False


def _others_stalled(trace_dir: Path, scenario: Scenario) -> bool:
    """Every rank but the bad one has dumped a stall: it has waited in a collective past the hang threshold."""
    others = [r for r in range(scenario.world) if r != scenario.rank]
    return all(any(trace_dir.glob(f"rank{r:05d}/hang_dump_*.json")) for r in others)


def _end_all(procs: list[subprocess.Popen]) -> list[tuple[str, str]]:
    grace_end = time.monotonic() + 10
    while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    left = [proc for proc in procs if proc.poll() is None]
    for proc in left:  # where each was stuck, in its output (fault_job registers SIGUSR1 with faulthandler)
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGUSR1)
    time.sleep(1 if left else 0)
    for proc in left:
        proc.kill()
    return [proc.communicate() for proc in procs]


# -- judging --------------------------------------------------------------------------------------------------


def _diag_json(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "diag", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if result.returncode not in (0, 1):  # 1: a problem found (a finding at or above --fail-on, a hang verdict)
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output")
    return json.loads(result.stdout)


def _judge_analyze(trace_dir: Path) -> Judgement:
    """The verdict is the first finding (they are ranked by cost, failures first) that names particular ranks;
    its kind, with a straggler's cause, and its ranks. Findings above low are kept for the false-alarm rate."""
    report = _diag_json("analyze", str(trace_dir), "--no-cache")
    findings = report.get("findings", [])
    world = set(report.get("run", {}).get("ranks_found") or [])
    above_low = [f for f in findings if f.get("severity") in SEVERITY_ABOVE_LOW]
    alarms = [f"{f['kind']}[{f['severity']}]" for f in above_low if not _is_job_wide(f, world)]
    job_wide = [f"{f['kind']}[{f['severity']}]" for f in above_low if _is_job_wide(f, world)]
    for finding in findings:
        kind, ranks = finding["kind"], sorted(finding.get("ranks") or [])
        if finding.get("severity") not in SEVERITY_ABOVE_LOW:
            continue
        if kind in ("crash", "step_error"):  # every rank may have raised: the culprit the finding names, else
            # the first to raise (a rank whose exception left no step error, as an HF Trainer's optimizer step
            # raising outside its training_step, is named from its exit: "culprit as diag triage judges it")
            named = _named_culprits(finding.get("evidence") or [])
            errors = report.get("run", {}).get("step_errors") or []
            first = [int(errors[0]["rank"])] if errors else ranks
            return Judgement("crash", named or first, alarms, job_wide)
        if not ranks or set(ranks) == world:
            continue
        if kind == "straggler":
            cause = _straggler_cause(finding.get("title", ""))
            return Judgement(f"straggler:{cause}", ranks, alarms, job_wide)
        return Judgement(kind, ranks, alarms, job_wide)
    return Judgement("none", [], alarms, job_wide)


def _named_culprits(evidence: list[str]) -> list[int]:
    """The ranks of a crash finding's 'culprit as diag triage judges it (verdict): 2, 3; ...' line, if any."""
    for line in evidence:
        match = re.match(r"culprit as diag triage judges it \([a-z_]+\): ([0-9, ]+)", line)
        if match:
            return sorted(int(r) for r in match.group(1).replace(" ", "").split(",") if r)
    return []


def _is_job_wide(finding: dict, world: set) -> bool:
    """A finding about the whole job's performance, true of a healthy run too: JOB_WIDE_KINDS, and a pipeline
    bubble that names every stage (the schedule's own idle time, not a slow stage)."""
    if finding["kind"] in JOB_WIDE_KINDS:
        return True
    return finding["kind"] == "pipeline_bubble" and set(finding.get("ranks") or []) >= world


def _straggler_cause(title: str) -> str:
    """'Rank 1 (dp=0, tp=1) is a persistent straggler (compute): ...' -> compute."""
    match = re.search(r"stragglers? \(([^)]*)\)", title)
    return (match.group(1).strip() or "unknown") if match else "unknown"


def _judge_triage(trace_dir: Path) -> Judgement:
    verdict = _diag_json("triage", str(trace_dir))
    culprits = sorted(int(r) for r in verdict.get("culprit_ranks") or [])
    return Judgement(str(verdict.get("verdict")), culprits, action=verdict.get("action"))


def _fault_at(trace_dir: Path) -> float | None:
    try:
        return float(json.loads((trace_dir / "fault_at.json").read_text())["time_s"])
    except (OSError, ValueError, KeyError):
        return None


def _fault_to_dump_s(trace_dir: Path, fault_at: float | None) -> float | None:
    dumps = [p.stat().st_mtime for p in trace_dir.glob("rank*/hang_dump_*.json")]
    return (min(dumps) - fault_at) if dumps and fault_at is not None else None


# -- A/A compare: the same healthy job twice, one run after the other ---------------------------------------


@dataclass
class Pair:
    scenario: Scenario
    verdict: str
    change_pct: float | None
    run_s: float
    error: str | None = None


def draw_pairs(n: int, seed: int, shapes, computes, worlds, loads) -> list[Scenario]:
    plain = [s for s in shapes if s not in ("elastic",)] or list(shapes)  # healthy: elastic is propagate
    return [
        Scenario(s.shape, s.compute, s.world, "healthy", NO_WHERE, s.load, 0, 0)
        for s in draw_scenarios(n, seed, plain, computes, worlds, ("healthy",), loads)
    ]


def run_pair(scenario: Scenario, workdir: Path) -> Pair:
    start = time.monotonic()
    runs = [workdir / "a", workdir / "b"]
    with burners(scenario.load):
        past_deadline = [run_job(scenario, trace_dir)[2] for trace_dir in runs]
    if any(past_deadline) or not all(trace_dir.is_dir() for trace_dir in runs):  # the harness's, as in run_case
        error = f"the suite's deadline ({JOB_DEADLINE_S:.0f} s) ended a job"
        return Pair(scenario, "not_run", None, time.monotonic() - start, error)
    try:
        report = _diag_json("compare", *map(str, runs), "--no-cache")
        (workdir / "compare.json").write_text(json.dumps(report, indent=1))  # kept with the runs (--keep)
        verdict, change = _compare_verdict(report)
        error = None
    except Exception as exc:
        verdict, change, error = "error", None, f"{type(exc).__name__}: {exc}"
    return Pair(scenario, verdict, change, time.monotonic() - start, error)


def _compare_verdict(report: dict) -> tuple[str, float | None]:
    """The verdict of BASE against NEW in ``diag compare --format json``, and its steady step time's change."""
    change = (report.get("step_time") or {}).get("steady_change_pct")
    return str(report.get("verdict")), round(float(change), 1) if change is not None else None


# -- summaries ------------------------------------------------------------------------------------------------


def _rate(hits: int, total: int) -> str:
    return f"{hits} / {total} ({100 * hits / total:.1f}%)" if total else "-"


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def dimension_value(outcome: Outcome, dimension: str) -> str:
    return str(getattr(outcome.scenario, dimension))


def summarize(outcomes: list[Outcome]) -> dict:
    not_run = sum(not o.ran for o in outcomes)
    outcomes = [o for o in outcomes if o.ran]
    faulty = [o for o in outcomes if o.scenario.kind != "healthy"]
    healthy = [o for o in outcomes if o.scenario.kind == "healthy"]
    given_total = sum(len(o.culprits) for o in outcomes)
    expected_total = sum(len(o.scenario.expected_culprits) for o in faulty)
    hits = sum(len(set(o.culprits) & set(o.scenario.expected_culprits)) for o in outcomes)
    by_tool = defaultdict(list)
    for o in outcomes:
        if o.fault_to_verdict_s is not None:
            by_tool[o.scenario.tool].append(o.fault_to_verdict_s)
    dumps = [o.fault_to_dump_s for o in outcomes if o.fault_to_dump_s is not None]
    per_dimension = {}
    for dimension in DIMENSIONS:
        groups = defaultdict(list)
        for o in outcomes:
            groups[dimension_value(o, dimension)].append(o)
        per_dimension[dimension] = {
            value: {
                "runs": len(mine),
                "verdict_right": sum(o.verdict_right for o in mine),
                "culprit_right": sum(o.culprit_right for o in mine),
            }
            for value, mine in sorted(groups.items())
        }
    false_alarms_by_load = {}
    for load in LOADS:
        mine = [o for o in healthy if o.scenario.load == load]
        if mine:
            false_alarms_by_load[load] = {
                "healthy_runs": len(mine),
                "with_alarm": sum(bool(o.false_alarms) for o in mine),
            }
    return {
        "runs": len(outcomes),
        "not_run": not_run,  # jobs the suite's deadline ended (the harness's failure): left out of every figure
        "verdict_right": sum(o.verdict_right for o in outcomes),
        "culprit_right": sum(o.culprit_right for o in outcomes),
        "action_judged": sum(o.action_right is not None for o in outcomes),
        "action_right": sum(bool(o.action_right) for o in outcomes),
        "actions_wrong": [
            f"{o.scenario.label()}: {o.action} (want {o.scenario.expected_action})"
            for o in outcomes
            if o.action_right is False
        ],  # fmt: skip
        "verdict_accuracy": sum(o.verdict_right for o in outcomes) / len(outcomes) if outcomes else None,
        "culprit_accuracy": sum(o.culprit_right for o in outcomes) / len(outcomes) if outcomes else None,
        "culprit_precision": hits / given_total if given_total else None,
        "culprit_recall": hits / expected_total if expected_total else None,
        "healthy_runs": len(healthy),
        "false_alarm_rate": sum(bool(o.false_alarms) for o in healthy) / len(healthy) if healthy else None,
        "false_alarms_by_load": false_alarms_by_load,
        "false_alarm_kinds": dict(Counter(a for o in healthy for a in o.false_alarms)),
        "job_wide_findings_on_healthy_runs": dict(Counter(a for o in healthy for a in o.job_wide)),
        "diag_errors": sum(o.error is not None for o in outcomes),
        "fault_to_dump_s_median": _median(dumps),
        "fault_to_dump_s_max": round(max(dumps), 2) if dumps else None,
        "fault_to_verdict_s_median": {tool: _median(v) for tool, v in sorted(by_tool.items())},
        "fault_to_verdict_s_max": {tool: round(max(v), 2) for tool, v in sorted(by_tool.items())},
        "judge_s_median": _median([o.judge_s for o in outcomes]),
        "per_dimension": per_dimension,
    }


def summarize_pairs(pairs: list[Pair]) -> dict:
    """Pairs whose jobs the suite's deadline ended are counted apart and left out, as runs are."""
    not_run = sum(p.verdict == "not_run" for p in pairs)
    pairs = [p for p in pairs if p.verdict != "not_run"]
    by_load = {}
    for load in LOADS:
        mine = [p for p in pairs if p.scenario.load == load]
        if mine:
            by_load[load] = {"pairs": len(mine), "no_change": sum(p.verdict == "no change" for p in mine)}
    return {
        "pairs": len(pairs),
        "no_change": sum(p.verdict == "no change" for p in pairs),
        "verdicts": dict(Counter(p.verdict for p in pairs)),
        "by_load": by_load,
        "not_run": not_run,
    }


def confusion(outcomes: list[Outcome]) -> dict[str, Counter]:
    matrix: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        matrix[o.expected][o.given] += 1
    return matrix


def markdown(outcomes: list[Outcome], pairs: list[Pair]) -> str:
    """The tables docs/benchmarks.md shows, from the outcomes of one or more result files."""
    lines = []
    if outcomes:
        s = summarize(outcomes)
        lines += ["| figure | value |", "|---|---|"]
        lines.append(f"| runs | {s['runs']} ({s['runs'] - s['healthy_runs']} faulty, {s['healthy_runs']} healthy) |")
        if s["not_run"]:
            lines.append(f"| jobs ended by the suite's deadline, not judged (left out) | {s['not_run']} |")
        lines.append(f"| right verdict | {_rate(s['verdict_right'], s['runs'])} |")
        lines.append(f"| right culprit set | {_rate(s['culprit_right'], s['runs'])} |")
        if s["action_judged"]:
            rate = _rate(s["action_right"], s["action_judged"])
            lines.append(f"| right action (`diag triage`, asked of every run) | {rate} |")
        precision, recall = s["culprit_precision"], s["culprit_recall"]
        lines.append(
            f"| culprit precision / recall | {precision and round(precision, 3)} / {recall and round(recall, 3)} |"
        )
        for load, fa in s["false_alarms_by_load"].items():
            lines.append(f"| healthy runs with a finding above `low` naming ranks, load {load} | "
                         f"{_rate(fa['with_alarm'], fa['healthy_runs'])} |")  # fmt: skip
        if s["false_alarm_kinds"]:
            lines.append(f"| false alarm kinds | {', '.join(f'{k} x{n}' for k, n in s['false_alarm_kinds'].items())} |")
        lines.append(f"| diag itself failed | {s['diag_errors']} |")
        for load, average in _load_averages(outcomes).items():
            lines.append(f"| machine load average at the jobs' ends, load {load} (median, max) | {average} |")
        lines.append(
            f"| fault to first stall dump (s) | median {s['fault_to_dump_s_median']}, max {s['fault_to_dump_s_max']} |"
        )
        for tool, median in s["fault_to_verdict_s_median"].items():
            lines.append(
                f"| fault to verdict, `diag {tool}` (s) | median {median}, max {s['fault_to_verdict_s_max'][tool]} |"
            )
        for dimension, values in s["per_dimension"].items():
            lines += ["", f"| {dimension} | runs | right verdict | right culprits |", "|---|---|---|---|"]
            for value, c in values.items():
                lines.append(
                    f"| {value} | {c['runs']} | {_rate(c['verdict_right'], c['runs'])} | "
                    f"{_rate(c['culprit_right'], c['runs'])} |"
                )
        matrix = confusion([o for o in outcomes if o.ran])
        givens = sorted({g for row in matrix.values() for g in row})
        lines += ["", "| expected \\ given | " + " | ".join(givens) + " |", "|---" * (len(givens) + 1) + "|"]
        for want in sorted(matrix):
            lines.append(f"| {want} | " + " | ".join(str(matrix[want].get(g, "")) for g in givens) + " |")
    if pairs:
        p = summarize_pairs(pairs)
        lines += ["", "| same job twice (A/A), load | pairs | `compare` reads no change |", "|---|---|---|"]
        for load, c in p["by_load"].items():
            lines.append(f"| {load} | {c['pairs']} | {_rate(c['no_change'], c['pairs'])} |")
        lines.append(f"| all | {p['pairs']} | {_rate(p['no_change'], p['pairs'])} |")
        if p["not_run"]:
            lines.append(f"| pairs a job of which the suite's deadline ended (left out) | {p['not_run']} | |")
    return "\n".join(lines)


def _load_averages(outcomes: list[Outcome]) -> dict[str, str]:
    """Per load level, the 1-minute load average the runs ended at: their burners and whatever else ran."""
    out = {}
    for load in LOADS:
        seen = [o.load_average_1m for o in outcomes if o.scenario.load == load and o.load_average_1m is not None]
        if seen:
            out[load] = f"{statistics.median(seen):.1f}, {max(seen):.1f}"
    return out


def print_report(outcomes: list[Outcome], pairs: list[Pair]) -> None:
    wrong = [o for o in outcomes if not (o.verdict_right and o.culprit_right)]
    if wrong:
        print("\nWrong runs:")
        for o in wrong:
            print(
                f"  {o.scenario.label()}: gave {o.given} {o.culprits}, wanted {o.expected} "
                f"{o.scenario.expected_culprits}" + (f" ({o.error})" if o.error else "")
            )
    print()
    print(markdown(outcomes, pairs))
    if outcomes:
        s = summarize(outcomes)
        print(
            f"\nfalse alarm kinds: {s['false_alarm_kinds']}; job-wide on healthy: {s['job_wide_findings_on_healthy_runs']}"
        )


# -- result files ---------------------------------------------------------------------------------------------


def load_results(path: Path) -> tuple[dict, list[Outcome], list[Pair]]:
    data = json.loads(path.read_text())
    outcomes = [Outcome(scenario=Scenario(**r.pop("scenario")), **r) for r in data.get("runs", [])]
    pairs = [Pair(scenario=Scenario(**p.pop("scenario")), **p) for p in data.get("pairs", [])]
    return data.get("config", {}), outcomes, pairs


def save_results(path: Path, config: dict, outcomes: list[Outcome], pairs: list[Pair]) -> None:
    data = {"config": config, "runs": [asdict(o) for o in outcomes], "pairs": [asdict(p) for p in pairs]}
    if outcomes:
        data["summary"] = summarize(outcomes)
    if pairs:
        data["compare_summary"] = summarize_pairs(pairs)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)  # a run stopped mid-write leaves the last whole file, to --resume from


def _csv(text: str, known, convert=str) -> tuple:
    values = tuple(convert(v) for v in text.split(",") if v)
    unknown = [v for v in values if v not in known]
    if unknown:
        raise SystemExit(f"unknown {unknown}; known: {', '.join(map(str, known))}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2 * len(FAULTS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated job shapes to draw from")
    parser.add_argument("--computes", default=",".join(COMPUTES))
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    parser.add_argument("--kinds", default=",".join(FAULTS), help="comma-separated fault kinds to draw from")
    parser.add_argument("--loads", default=",".join(LOADS), help="CPU burners beside the job: none, 1x, 2x cores")
    parser.add_argument("--wheres", help="comma-separated strike points to draw from (default: every one)")
    parser.add_argument("--compare-pairs", type=int, default=0, help="A/A: run N healthy jobs twice, diag compare")
    parser.add_argument("--out", type=Path, help="write every outcome and the summary as JSON (after each run)")
    parser.add_argument("--resume", type=Path, help="continue the runs of a partial --out file, into it")
    parser.add_argument("--table", type=Path, nargs="+", help="print the markdown tables of result files")
    parser.add_argument("--keep", type=Path, help="keep each run's traces and rank output under this directory")
    parser.add_argument(
        "--rejudge",
        type=Path,
        nargs=2,
        metavar=("RESULTS", "KEPT"),
        help="judge the kept traces of a results file again with today's diag (not fresh runs)",
    )
    args = parser.parse_args(argv)
    if args.rejudge:
        outcomes = rejudge(*args.rejudge)
        print_report(outcomes, [])
        if args.out:
            save_results(args.out, {"rejudged": str(args.rejudge[0])}, outcomes, [])
        return 0
    if args.table:
        outcomes, pairs = [], []
        for path in args.table:
            _, o, p = load_results(path)
            outcomes += o
            pairs += p
        print(markdown(outcomes, pairs))
        return 0
    done, done_pairs = [], []
    if args.resume:
        config, done, done_pairs = load_results(args.resume)
        out = args.resume
    else:
        config = {
            "runs": args.runs,
            "seed": args.seed,
            "shapes": _csv(args.shapes, SHAPES),
            "computes": _csv(args.computes, COMPUTES),
            "worlds": _csv(args.worlds, WORLDS, int),
            "kinds": _csv(args.kinds, FAULTS),
            "loads": _csv(args.loads, LOADS),
            "wheres": _csv(args.wheres, (*_ALL, "between")) if args.wheres else None,
            "compare_pairs": args.compare_pairs,
        }
        out = args.out
    dims = [config[k] for k in ("shapes", "computes", "worlds", "kinds", "loads")]
    wheres = config.get("wheres")
    scenarios = (
        draw_scenarios(config["runs"], config["seed"], *dims, wheres=tuple(wheres) if wheres else None)
        if not config["compare_pairs"]
        else []
    )
    pair_scenarios = (
        draw_pairs(config["compare_pairs"], config["seed"], dims[0], dims[1], dims[2], dims[4])
        if config["compare_pairs"]
        else []
    )
    print(f"{len(scenarios)} runs, {len(pair_scenarios)} A/A pairs, seed {config['seed']}; "
          f"{len(done)} runs and {len(done_pairs)} pairs already done", flush=True)  # fmt: skip
    outcomes, pairs = list(done), list(done_pairs)
    if len(outcomes) < len(scenarios) or len(pairs) < len(pair_scenarios):
        # stopped from outside: leave through the finally blocks, which stop the job's ranks and the burners
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prepare({s.shape for s in scenarios + pair_scenarios})
    for i, scenario in enumerate(scenarios[len(done) :], start=len(done)):
        with tempfile.TemporaryDirectory(prefix="diag-fault-") as tmp:
            outcome = run_case(scenario, Path(tmp))
            if args.keep:  # the traces and each rank's output
                shutil.copytree(tmp, args.keep / f"{i:03d}-{scenario.kind}", dirs_exist_ok=True)
        outcomes.append(outcome)
        mark = "ok " if outcome.verdict_right and outcome.culprit_right else "BAD"
        print(f"[{i + 1:>3}/{len(scenarios)}] {mark} {scenario.label()} -> {outcome.given} {outcome.culprits} "
              f"(want {outcome.expected} {scenario.expected_culprits}; {outcome.run_s:.0f} s)", flush=True)  # fmt: skip
        if out:
            save_results(out, config, outcomes, pairs)
    for i, scenario in enumerate(pair_scenarios[len(done_pairs) :], start=len(done_pairs)):
        with tempfile.TemporaryDirectory(prefix="diag-aa-") as tmp:
            pair = run_pair(scenario, Path(tmp))
            if args.keep:  # both runs' traces and the comparison
                shutil.copytree(tmp, args.keep / f"aa-{i:03d}", dirs_exist_ok=True)
        pairs.append(pair)
        print(f"[{i + 1:>3}/{len(pair_scenarios)}] A/A {scenario.label()} -> {pair.verdict} "
              f"{pair.change_pct} ({pair.run_s:.0f} s)" + (f" {pair.error}" if pair.error else ""), flush=True)  # fmt: skip
        if out:
            save_results(out, config, outcomes, pairs)
    print_report(outcomes, pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
