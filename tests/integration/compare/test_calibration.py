"""Machine-speed calibration (issue 29 §4): capture writes calibration rows at init, every N steps and at finish,
outside the steps' timing; ``diag compare`` separates "this machine ran slower" from "this job got slower".

The real-run tests run tests/compare/compare_job.py with 3 ranks (gloo, CPU) one run after the other, as the
issue did, with one CPU burner (``python3 -c "while True: pass"``) beside one of the two runs only, killed in a
``finally``. On the shared 2-core machine they were written on, other load comes and goes too (a load average
of 13-34 while they were measured): a run's median step moved between 30 and 107 ms with no change of the job,
which is the point."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest

import diag
from diag.capture import calibration
from tests.compare.helpers import compare_json, run_job

JOB = ("--steps", "200", "--width", "128", "--depth", "8", "--batch", "64", "--calibrate-every", "10")


# -- real runs -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def burner():
    """One CPU burner beside what runs inside; always killed."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_the_same_job_with_a_burner_beside_one_run_reads_no_change(tmp_path):
    run_job(tmp_path / "quiet", 3, *JOB)
    with burner():
        run_job(tmp_path / "burner", 3, *JOB)
    data = compare_json(tmp_path / "quiet", tmp_path / "burner", extra=("--no-cache",))
    m = data["step_time"]["machine"]
    print("same job, burner beside the second:", data["summary"])
    assert m is not None and m["source"] == "runqueue"
    assert data["verdict"] == "no change", data["summary"]


@pytest.mark.slow
def test_a_planted_regression_with_a_burner_beside_the_faster_run_reads_regression(tmp_path):
    with burner():
        run_job(tmp_path / "base", 3, *JOB)
    # the forward and backward 3 times and 30 ms more of the step's sleep (10 ms by default): well over the 35%
    # floor of one calibrated pair on any machine (where the compute is a small part of the step, 3 times the
    # compute alone was +21%)
    run_job(tmp_path / "slower", 3, *JOB, "--compute-repeats", "3", "--work-ms", "40")
    data = compare_json(tmp_path / "base", tmp_path / "slower", extra=("--no-cache",))
    print("planted regression, burner beside the base:", data["summary"])
    assert data["step_time"]["machine"] is not None
    assert data["verdict"] == "regression", data["summary"]


def test_the_calibration_costs_little_against_the_steps(tmp_path):
    """Every 10 steps (20x the default rate), the calibrations' wall time, all included, stays under a tenth of
    the steps' time (a 512-wide MLP on 256 samples at the job's thread count; under load both slow alike)."""
    import time

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    batch = torch.randn(256, 512)
    session = diag.init(tmp_path, telemetry=False, watchdog=False, calibrate_every=10)
    started = time.perf_counter()
    for _ in range(40):
        with diag.step():
            model(batch).square().mean().backward()
    wall_s = time.perf_counter() - started
    costs_s = list(session.calibrator.costs_s)
    diag.finish()
    assert len(costs_s) == 1 + 4  # init, then after steps 9, 19, 29, 39 (finish's comes after)
    in_loop_s = sum(costs_s[1:])
    print(f"calibration: {1e3 * in_loop_s / 4:.1f} ms each; steps {1e3 * (wall_s - in_loop_s) / 40:.1f} ms each")
    assert 0 < in_loop_s < 0.1 * (wall_s - in_loop_s)


def test_the_calibration_stands_aside_while_torch_compile_traces():
    """Inside a region torch.compile traces, a calibration would be compiled into the user's graph: it skips."""
    import torch

    @torch.compile(backend="eager", fullgraph=False)
    def traced(x):
        return x + 1 if calibration._capturing_or_compiling() else x - 1

    assert traced(torch.zeros(1)).item() == 1.0
    assert not calibration._capturing_or_compiling()  # eager: it runs
