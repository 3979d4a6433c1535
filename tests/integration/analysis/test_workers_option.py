"""Where rank-parallel work runs: ``diag.processes.worker_count`` decides for ``diag analyze``'s partitioned path,
``diag triage``'s reads and the dashboard, and ``--workers N`` overrides it. The reports are checked on synthetic
traces (diag/testing/synthetic.py: real trace files, problems planted at known ranks) read by real forked worker
processes and by this process alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from diag import processes
from diag.cli import main
from diag.processes import PARTITIONED_MIN_RANKS, PROCESS_MIN_RANKS, WORKERS_MAX, default_workers, worker_count
from tests.analysis.golden import differences
from tests.analysis.helpers import REPO, synthetic

RANKS, STEPS, PER_STEP = PARTITIONED_MIN_RANKS + 8, 12, 4  # above PARTITIONED_MIN_RANKS: the partitioned path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    plants = synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=2)
    return path, plants


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    path = tmp_path_factory.mktemp("hang")
    plants = synthetic.generate(path, RANKS, STEPS, PER_STEP, trace_format=2, hang=True, heartbeat_groups=False)
    return path, plants


@pytest.fixture
def forks(monkeypatch):
    """The worker processes started (each one's target), for the partitioned analysis and for triage."""
    started, real = [], processes.start_worker
    monkeypatch.setattr(processes, "start_worker", lambda target, *args: started.append(target) or real(target, *args))
    return started


class _OtherThread:
    """A thread running beside the test, as a server's are."""

    def __enter__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stop.wait)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# -- the decision ---------------------------------------------------------------------------------------------
def test_explicit_workers_win_over_size_and_threads_capped_at_the_ranks():
    assert worker_count(3, workers=2) == 2  # a small trace
    assert worker_count(10 * PROCESS_MIN_RANKS, workers=WORKERS_MAX + 3) == WORKERS_MAX + 3  # above the default cap
    assert worker_count(2, workers=8) == 2  # never more workers than ranks
    assert worker_count(10 * PROCESS_MIN_RANKS, workers=1) == 1
    with _OtherThread():
        assert worker_count(10 * PROCESS_MIN_RANKS, workers=3) == 3


def test_no_workers_beside_other_threads_by_default(monkeypatch):
    monkeypatch.setattr(processes, "default_workers", lambda: 4)  # as on a 4-core machine
    assert worker_count(10 * PROCESS_MIN_RANKS) == 4
    with _OtherThread():  # a fork would copy the locks that thread holds
        assert worker_count(10 * PROCESS_MIN_RANKS) == 1


def test_small_traces_are_read_in_this_process(monkeypatch):
    monkeypatch.setattr(processes, "default_workers", lambda: 4)
    assert worker_count(PROCESS_MIN_RANKS - 1) == 1
    assert worker_count(PROCESS_MIN_RANKS) == 4


def test_the_load_average_does_not_decide(monkeypatch):
    """A busy box is the user's call (--workers 1), not a guess from the last minute's load."""
    monkeypatch.setattr(processes, "default_workers", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert worker_count(PROCESS_MIN_RANKS) == 2


def test_the_default_is_this_process_cpu_affinity_capped():
    """Each child runs with its CPU affinity set by the kernel (os.sched_setaffinity) before it asks."""
    cores = sorted(os.sched_getaffinity(0))
    code = "from diag.processes import default_workers, worker_count, PROCESS_MIN_RANKS as M; "
    code += "print(default_workers(), worker_count(M))"
    for allowed in ({cores[0]}, set(cores[:2]), set(cores)):
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            preexec_fn=lambda allowed=allowed: os.sched_setaffinity(0, allowed),
            timeout=60,
            check=True,
        )
        expected = min(len(allowed), WORKERS_MAX)
        assert result.stdout.split() == [str(expected), str(expected)], (allowed, result.stdout)
    assert default_workers() == min(len(cores), WORKERS_MAX)


def test_the_cap_applies_to_many_cores(monkeypatch):
    """More cores than this machine has: the affinity is stood in for (the one mock here)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert default_workers() == WORKERS_MAX


def test_fewer_than_one_worker_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        worker_count(100, workers=0)


# -- diag analyze --------------------------------------------------------------------------------------------
def _analyze(path, *options) -> dict:
    result = CliRunner().invoke(
        main, ["analyze", str(path), "--format", "json", "--no-cache", "--fail-on", "never", *options]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_analyze_gives_the_same_report_in_one_process_and_in_two_workers(run, forks):
    path, plants = run
    alone = _analyze(path, "--workers", "1")
    assert forks == []  # everything in this process
    in_workers = _analyze(path, "--workers", "2")
    assert forks == [processes._serve] * 2  # one pool: the load, memory and telemetry, the collectives
    assert differences(alone, in_workers) == []
    assert [(f["kind"], f["severity"]) for f in alone["findings"]] == [
        (f["kind"], f["severity"]) for f in in_workers["findings"]
    ]
    assert plants.compute_straggler in {s["rank"] for s in in_workers["stragglers"]}


def test_analyze_workers_is_refused_with_a_scheduler(run):
    path, _ = run
    result = CliRunner().invoke(main, ["analyze", str(path), "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "--scheduler" in result.output


# -- diag triage ---------------------------------------------------------------------------------------------
def _triage(path, *options) -> dict:
    result = CliRunner().invoke(main, ["triage", str(path), "--format", "json", *options])
    assert result.exit_code in (0, 1), result.output  # 1: a hang was found
    return json.loads(result.stdout)


def test_triage_gives_the_same_verdict_in_one_process_and_in_two_workers(hang, forks):
    path, plants = hang
    alone = _triage(path, "--workers", "1")
    assert forks == []
    in_workers = _triage(path, "--workers", "2")
    assert forks == [processes._serve] * 2
    assert in_workers == alone
    assert plants.hang_stuck in in_workers["culprit_ranks"]


# -- usage errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["analyze", "triage", "compare", "dashboard"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_worker_count_below_one_is_a_usage_error(tmp_path, command, value):
    result = CliRunner().invoke(main, [command, str(tmp_path), "--workers", value])
    assert result.exit_code == 2
    assert "--workers" in result.output and repr(value) in result.output
    assert ("give 1 or more worker processes" in result.output) or ("whole number" in result.output)


@pytest.mark.parametrize("command", ["analyze", "triage", "compare", "dashboard"])
def test_workers_is_in_the_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--workers N" in result.output
