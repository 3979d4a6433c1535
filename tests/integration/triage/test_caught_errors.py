"""A timeout the job catches is judged as one that ends it: real gloo jobs (caught_job.py) whose slow rank
computes past the collective timeout in step 5, wrapped in the error handling users write around their loops.

Whatever the handler does (print and ``diag.finish``, ``finally``, ``sys.exit(1)``, log and go on to the next
step, ``diag.Trainer`` catching, a restart writing into the same directory), ``diag triage`` must give the
verdict the same job gets when the exception propagates: ``missing_ranks``, the slow rank the culprit, placed in
its compute, and say the job caught the error. ``diag analyze`` must say the step failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import start_ranks
from diag.trace.records import Heartbeat
from tests.triage.jobs import diag_triage_json

pytestmark = pytest.mark.slow
CAUGHT_JOB = Path(__file__).resolve().parents[2] / "triage" / "caught_job.py"
LIGHTNING_JOB = Path(__file__).resolve().parents[2] / "triage" / "lightning_caught_job.py"
HF_JOB = Path(__file__).resolve().parents[2] / "triage" / "hf_caught_job.py"
FRAMEWORK_JOBS = {"lightning": LIGHTNING_JOB, "hf": HF_JOB}  # jobs that take only the trace directory
PG_TIMEOUT_S = 4
STOPPED_FOR_S = PG_TIMEOUT_S + 5  # a SIGSTOPped rank is continued this long after it stopped: after the timeout
JOB_DEADLINE_S = 300  # a loaded machine runs these jobs several times slower; past it ranks are killed
BAD_STEP = 5


def _heartbeat(trace_dir: Path, rank: int) -> Heartbeat | None:
    try:
        return Heartbeat.from_json(json.loads((trace_dir / f"rank{rank:05d}" / "heartbeat.json").read_text()))
    except (OSError, ValueError):
        return None


def _exited(trace_dir: Path, rank: int, pid: int) -> bool:
    """diag is done with the rank's process ``pid`` (its heartbeat has an exit record): a gloo process may then
    linger in its teardown for a minute, which says nothing of the job."""
    beat = _heartbeat(trace_dir, rank)
    return beat is not None and beat.pid == pid and beat.exit is not None


def run_job(shape: str, trace_dir: Path, world_size: int, bad_rank: int, env: dict | None = None) -> list[int | None]:
    """Run one job to its end (every rank's diag finished or its process ended); returns the exit codes (None:
    killed after diag was done with it)."""
    env = {"CAUGHT_BAD_RANK": str(bad_rank), "CAUGHT_PG_TIMEOUT_S": str(PG_TIMEOUT_S), **(env or {})}
    job = FRAMEWORK_JOBS.get(shape)
    argv = [str(job), str(trace_dir)] if job else [str(CAUGHT_JOB), shape, str(trace_dir)]
    procs = start_ranks(argv, world_size, env)
    stopped_at = None
    deadline = time.monotonic() + JOB_DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if shape == "stopped" and stopped_at is None and (trace_dir / "ready").exists():
                time.sleep(0.3)  # inside its step's compute
                procs[bad_rank].send_signal(signal.SIGSTOP)
                stopped_at = time.monotonic()
            if stopped_at and time.monotonic() > stopped_at + STOPPED_FOR_S:
                procs[bad_rank].send_signal(signal.SIGCONT)
                stopped_at = -1.0
            if all(p.poll() is not None or _exited(trace_dir, r, p.pid) for r, p in enumerate(procs)):
                time.sleep(0.5)  # the last events flushed
                break
            time.sleep(0.1)
        else:  # killed mid-run, its ranks would read dead: say so rather than judge that
            pytest.fail(f"the {shape} job did not end within {JOB_DEADLINE_S} s")
    finally:
        codes, outputs = [], []
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            stdout, stderr = proc.communicate()
            codes.append(proc.returncode if proc.returncode >= 0 else None)
            outputs.append((stdout + stderr)[-2000:])
    if not any(trace_dir.glob("rank*")):  # the job failed before diag started: what the ranks printed says why
        pytest.fail(f"the {shape} job wrote no trace; exit codes {codes}; its ranks printed:\n" + "\n".join(outputs))
    return codes


def run_two_attempts(trace_dir: Path, world_size: int, bad_rank: int) -> list[int | None]:
    """A restarted job writing into the same directory: the first attempt fails (the slow rank's timeout
    propagates), the second (TORCHELASTIC_RESTART_COUNT=1, as torchrun --max-restarts sets it) runs healthy.
    Launched twice rather than by torchrun: on this torch, gloo's rendezvous in torchrun's second attempt
    reads the first attempt's addresses from the store and fails (connectFullMesh: connection refused)."""
    run_job("propagate", trace_dir, world_size, bad_rank)
    exits = [_heartbeat(trace_dir, rank).exit.how for rank in range(world_size)]
    assert exits == ["exception"] * world_size  # the first attempt failed
    return run_job("propagate", trace_dir, world_size, bad_rank, {"TORCHELASTIC_RESTART_COUNT": "1"})


def run_ended_attempt_then_restart(shape: str, trace_dir: Path, world_size: int, bad_rank: int) -> list[int | None]:
    """A first attempt ended from outside, then a healthy restart into the same directory. ``killed``: the bad
    rank is SIGKILLed inside its compute and the others are stopped with SIGTERM a moment later, as torchrun
    stops the survivors of a dead worker. ``hung``: the others wait in the step's all_reduce (a long timeout)
    until their watchdogs saw the stall, then every rank is stopped with SIGTERM: no error was ever raised."""
    env = {"CAUGHT_BAD_RANK": str(bad_rank), "CAUGHT_PG_TIMEOUT_S": "60"}
    procs = start_ranks([str(CAUGHT_JOB), shape, str(trace_dir)], world_size, env)
    others = [p for r, p in enumerate(procs) if r != bad_rank]
    deadline = time.monotonic() + JOB_DEADLINE_S
    try:
        while not (trace_dir / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (trace_dir / "ready").exists(), "the bad rank never reached its step"
        time.sleep(0.3)  # inside its compute
        if shape == "killed":
            procs[bad_rank].send_signal(signal.SIGKILL)
            time.sleep(1.0)
        else:
            waiting = [trace_dir / f"rank{r:05d}" for r in range(world_size) if r != bad_rank]
            while not all(any(d.glob("hang_dump_*.json")) for d in waiting) and time.monotonic() < deadline:
                time.sleep(0.1)
            others = procs
        for proc in others:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    (trace_dir / "ready").unlink()
    return run_job("propagate", trace_dir, world_size, bad_rank, {"TORCHELASTIC_RESTART_COUNT": "1"})


def diag_analyze_json(path: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(path), "--format", "json", "--no-cache", "--fail-on", "never"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    cache: dict = {}

    def run(shape: str, world_size: int = 4, bad_rank: int = 3) -> tuple[Path, list]:
        key = (shape, world_size, bad_rank)
        if key not in cache:
            trace = tmp_path_factory.mktemp(f"{shape}_{world_size}_{bad_rank}") / "trace"
            trace.mkdir()
            if shape == "restart":
                codes = run_two_attempts(trace, world_size, bad_rank)
            elif shape in ("killed", "hung"):
                codes = run_ended_attempt_then_restart(shape, trace, world_size, bad_rank)
            else:
                codes = run_job(shape, trace, world_size, bad_rank)
            cache[key] = (trace, codes)
        return cache[key]

    return run


def _assert_late_rank_is_the_culprit(verdict: dict, bad_rank: int, world_size: int, shape: str = "caught") -> None:
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [bad_rank]
    assert verdict["collective"]["op"] == "all_reduce" and verdict["collective"]["pg"] != "0"  # the training group
    culprit = verdict["ranks"][str(bad_rank)]
    assert culprit["state"] == "stuck_in_compute", culprit  # placed where it was: its forward's compute
    assert culprit["last_step"] == BAD_STEP - 1
    if shape != "trainer":  # diag.Trainer's steps have no phases
        assert culprit["last_phase"] == "forward"
    if shape == "stopped":  # a stopped process's watchdog dumps nothing: placed by its phases table
        assert "when the timeout fired (its phases table)" in culprit["detail"]
    else:  # placed by its stall dump's stack, in the job's compute
        assert any("caught_job.py" in frame and "busy_compute" in frame for frame in culprit["stack"])
    others = [r for r in range(world_size) if r != bad_rank]
    assert {verdict["ranks"][str(r)]["state"] for r in others} == {"waiting_in_collective"}


@pytest.mark.parametrize(
    "shape",
    ["propagate", "caught", "finally", "exit", "continue", "stopped", "trainer"],
)
def test_caught_timeout_gets_the_verdict_of_the_propagating_one(jobs, shape):
    trace, _codes = jobs(shape)
    verdict = diag_triage_json(trace)
    _assert_late_rank_is_the_culprit(verdict, bad_rank=3, world_size=4, shape=shape)
    assert verdict["errors_caught"] is (shape != "propagate")
    if shape != "propagate":
        assert any(line.startswith("the job caught the error and finished") for line in verdict["evidence"])


@pytest.mark.parametrize(("world_size", "bad_rank"), [(2, 0), (2, 1), (4, 0)])
def test_caught_timeout_culprit_holds_across_world_sizes_and_ranks(jobs, world_size, bad_rank):
    trace, codes = jobs("caught", world_size, bad_rank)
    assert all(code in (0, None) for code in codes)  # the job caught the error: no rank failed
    verdict = diag_triage_json(trace)
    _assert_late_rank_is_the_culprit(verdict, bad_rank, world_size)
    assert verdict["errors_caught"] is True


def test_caught_timeout_text_says_the_job_caught_it(jobs):
    trace, _ = jobs("caught")
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(trace)], capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "HANG: rank 3 never reached a collective the others are waiting in"
    assert lines[1].startswith("the job caught the error and finished")
    assert "NO PROBLEM" not in result.stdout and "SLOW" not in result.stdout


@pytest.mark.parametrize("shape", ["caught", "continue"])
def test_analyze_says_the_step_failed_when_the_job_caught_the_error(jobs, shape):
    trace, _ = jobs(shape)
    report = diag_analyze_json(trace)
    assert {e["step"] for e in report["run"]["step_errors"]} >= {BAD_STEP}
    assert report["findings"][0]["kind"] == "step_error"  # first: a run that failed


@pytest.mark.parametrize(
    ("shape", "world_size", "bad_rank"),
    [("caught", 4, 3), ("propagate", 4, 3), ("caught", 2, 0), ("caught", 4, 0), ("propagate", 2, 0)],
)
def test_analyze_names_the_culprit_triage_names(jobs, shape, world_size, bad_rank):
    """The ranks waiting for the late one time out and raise first; the late rank raises last. ``diag analyze``'s
    failure finding names the rank ``diag triage`` names, and the first to raise only as detail."""
    trace, _ = jobs(shape, world_size, bad_rank)
    verdict = diag_triage_json(trace)
    report = diag_analyze_json(trace)
    assert verdict["culprit_ranks"] == [bad_rank]
    finding = report["findings"][0]
    assert finding["kind"] == ("step_error" if shape == "caught" else "crash")
    first = report["run"]["step_errors"][0]["rank"]
    assert first != bad_rank  # the first error is a waiting rank's timeout
    assert finding["title"].startswith(
        f"Rank {bad_rank} held up step {BAD_STEP}: the others waited for it in all_reduce"
    )
    assert f"; rank {first} raised first: " in finding["title"]
    assert f"culprit as diag triage judges it (missing_ranks): {bad_rank};" in finding["evidence"][0]


def test_lightning_fit_that_re_raises_a_caught_timeout_names_the_late_rank(jobs):
    """Lightning's DDP all-reduces gradients in its reducer (no collective error of diag's own): the failed
    step's untimed bucket and the step's error time stand in, as the exit record does when the error ends
    the process."""
    pytest.importorskip("lightning")
    trace, _ = jobs("lightning", 2, 1)
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["collective"]["op"] == "all_reduce"
    assert verdict["ranks"]["1"]["state"] == "stuck_in_compute"
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    assert verdict["errors_caught"] is True


def test_hf_trainer_train_that_raises_a_caught_timeout_names_the_late_rank(jobs):
    """transformers' Trainer has no exception event: DiagTrainerCallback wraps the Trainer's training_step, so
    the failed step is recorded (and the session finished) as Lightning's on_exception does; DDP's gradient
    buckets, read from Flight Recorder on gloo, carry the collective. The user's script catches what
    ``trainer.train()`` raises and exits cleanly."""
    pytest.importorskip("transformers")
    trace, codes = jobs("hf", 2, 1)
    assert all(code in (0, None) for code in codes)  # the script caught the error
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["collective"]["op"] == "all_reduce"
    assert verdict["ranks"]["1"]["state"] == "stuck_in_compute"
    stack = verdict["ranks"]["1"]["stack"]  # placed by its stall dump: in the model's forward, computing
    assert any("/hf_caught_job.py:" in frame and frame.endswith(" in forward") for frame in stack), stack
    assert stack[-1].endswith(" in busy_compute"), stack
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    assert verdict["errors_caught"] is True


def test_restart_into_the_same_directory_does_not_hide_the_failed_attempt(jobs):
    trace, codes = jobs("restart", 2, 1)
    assert all(code in (0, None) for code in codes)  # the second attempt ran clean
    verdict = diag_triage_json(trace)
    assert verdict["attempts"] == 2
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["collective"]["op"] == "all_reduce"
    assert any("2 attempts wrote into this directory" in line for line in verdict["evidence"])
    assert verdict["action"] == "fix_code"  # decided on the failed attempt's records, not the clean restart's


@pytest.mark.parametrize(("shape", "world_size", "bad_rank"), [("restart", 2, 1), ("killed", 3, 1)])
def test_analyze_of_a_restarted_job_names_the_culprit_triage_names(jobs, shape, world_size, bad_rank):
    """``diag analyze`` reads the latest attempt only; its failure finding still names the earlier attempt's
    culprit as ``diag triage`` judges it, from every attempt's records."""
    trace, _ = jobs(shape, world_size, bad_rank)
    verdict = diag_triage_json(trace)
    report = diag_analyze_json(trace)
    assert verdict["culprit_ranks"] == [bad_rank]
    finding = report["findings"][0]
    assert finding["kind"] in ("crash", "step_error"), finding
    assert finding["title"].startswith(f"Rank {bad_rank} "), finding["title"]


def test_rank_killed_in_an_attempt_a_restart_followed_is_named_dead(jobs):
    """The restart's heartbeats replace the first attempt's: the rank SIGKILLed in it is known dead only from
    the heartbeat the restart kept (it stopped beating while the others went on until their SIGTERM)."""
    trace, codes = jobs("killed", 3, 1)
    assert all(code in (0, None) for code in codes)  # the restart ran clean
    assert (trace / "rank00001" / "heartbeat_attempt_001.json").exists()
    verdict = diag_triage_json(trace)
    assert verdict["attempts"] == 2
    assert verdict["verdict"] == "dead_rank", verdict["evidence"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["ranks"]["1"]["state"] == "dead"
    assert verdict["action"] == "restart"  # killed without an error of its own
    assert any("2 attempts wrote into this directory" in line for line in verdict["evidence"])


def test_hang_stopped_by_signal_before_a_restart_is_named_from_its_own_attempt(jobs):
    """No rank raised: the first attempt's hang is told from the clean restart only by its own heartbeats and
    stall dumps, not read as a stall that cleared (slow) in a job that finished."""
    trace, codes = jobs("hung", 3, 1)
    assert all(code in (0, None) for code in codes)
    verdict = diag_triage_json(trace)
    assert verdict["attempts"] == 2
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["ranks"]["1"]["state"] == "stuck_in_compute", verdict["ranks"]["1"]
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    assert verdict["action"] == "fix_code"
    # diag analyze reads the clean restart: no error of it to report, yet the earlier failure comes first
    finding = diag_analyze_json(trace)["findings"][0]
    assert (finding["kind"], finding["ranks"]) == ("earlier_attempt_failed", [1]), finding
    assert "HANG: rank 1 never reached" in finding["title"]
