"""Exit statuses CI can act on, the same in every command (diag/commands/exit_codes.py, README "Exit status"):
0 no problem, 1 a problem found (a finding at or above --fail-on, a hang verdict, a regression), 2 a usage or
input error. Each command is run as a shell runs it (``python -m diag``), so the status is the process's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analysis.helpers import make_trace, synthetic
from tests.conftest import REPO

SAMPLES = REPO / "sample_traces"
PROBLEM, USAGE = 1, 2


def diag(*args, cwd: Path | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diag", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd or REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two synthetic 8-rank runs of one job: a clean one (no finding) and one with a compute straggler."""
    root = tmp_path_factory.mktemp("exit-codes")
    make_trace(root / "base", 8, 40, plants=synthetic.Plants(), seed=0)
    make_trace(root / "straggler", 8, 40, plants=synthetic.Plants(compute_straggler=2), seed=1)
    return root


# -- diag analyze ------------------------------------------------------------------------------------------------
def test_analyze_exits_0_when_nothing_reaches_fail_on(runs):
    result = diag("analyze", runs / "base", "--no-cache", "--fail-on", "low")
    assert result.returncode == 0, result.stderr
    assert "No problems found" in result.stdout


def test_analyze_exits_1_on_a_high_finding_by_default_and_0_with_fail_on_never():
    result = diag("analyze", SAMPLES / "straggler", "--no-cache")
    assert result.returncode == PROBLEM, result.stderr
    assert "[high]" in result.stdout and "at or above --fail-on high" in result.stderr
    assert diag("analyze", SAMPLES / "straggler", "--no-cache", "--fail-on", "never").returncode == 0


def test_analyze_fail_on_grades_by_severity(runs):
    report = json.loads(
        diag("analyze", runs / "straggler", "--no-cache", "--format", "json", "--fail-on", "never").stdout
    )
    severities = {f["severity"] for f in report["findings"]}
    assert severities, "the straggler run must have findings"
    for fail_on, ranks in (("high", 0), ("medium", 1), ("low", 2)):
        expected = PROBLEM if any({"high": 0, "medium": 1, "low": 2}[s] <= ranks for s in severities) else 0
        assert diag("analyze", runs / "straggler", "--no-cache", "--fail-on", fail_on).returncode == expected


@pytest.mark.parametrize("steps", ["100:200", "40:"])
def test_analyze_a_step_range_with_no_steps_is_an_input_error(steps):
    """A 40-step run: no step in 100:200 or from 40 on; nothing analysed is not "No problems found"."""
    result = diag("analyze", SAMPLES / "straggler", "--no-cache", "--steps", steps)
    assert result.returncode == USAGE, result.stdout
    assert result.stdout == ""
    assert f"no complete step of {SAMPLES / 'straggler'} in --steps {steps}" in result.stderr
    assert "40 steps" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("steps", ["50:10", "10:10", "a:b", "12"])
def test_analyze_a_range_that_holds_no_step_or_is_no_range_is_a_usage_error(steps):
    result = diag("analyze", SAMPLES / "straggler", "--no-cache", "--steps", steps)
    assert result.returncode == USAGE and "--steps" in result.stderr and result.stdout == ""


def test_analyze_a_missing_path_is_an_input_error(tmp_path):
    result = diag("analyze", tmp_path / "nope")
    assert result.returncode == USAGE and "does not exist" in result.stderr


def test_analyze_a_directory_with_nothing_usable_is_an_input_error(tmp_path):
    (tmp_path / "rank00000").mkdir()
    result = diag("analyze", tmp_path, "--no-cache")
    assert result.returncode == USAGE and "could be analysed" in result.stderr


# -- diag triage -------------------------------------------------------------------------------------------------
def test_triage_exits_1_on_a_hang_and_0_on_a_healthy_run():
    hang = diag("triage", SAMPLES / "hang")
    assert hang.returncode == PROBLEM, hang.stderr
    assert hang.stdout.startswith("HANG")
    healthy = diag("triage", SAMPLES / "straggler")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.startswith("NO PROBLEM")
    assert diag("triage", SAMPLES / "hang", "--format", "json").returncode == PROBLEM


def test_triage_a_missing_or_empty_path_is_an_input_error(tmp_path):
    assert diag("triage", tmp_path / "nope").returncode == USAGE
    assert diag("triage", tmp_path).returncode == USAGE


# -- diag compare ------------------------------------------------------------------------------------------------
def test_compare_exits_1_on_a_regression_and_0_without(runs):
    regressed = diag("compare", runs / "base", runs / "straggler", "--no-cache")
    assert regressed.returncode == PROBLEM, regressed.stderr
    assert "regression" in regressed.stdout and "step time regressed in straggler" in regressed.stderr
    assert diag("compare", runs / "base", runs / "straggler", "--no-cache", "--fail-on", "never").returncode == 0
    improved = diag("compare", runs / "straggler", runs / "base", "--no-cache")
    assert improved.returncode == 0, improved.stdout


def test_compare_a_missing_run_or_one_without_steps_is_an_input_error(runs, tmp_path):
    assert diag("compare", runs / "base", tmp_path / "nope").returncode == USAGE
    (tmp_path / "rank00000").mkdir()
    assert diag("compare", runs / "base", tmp_path, "--no-cache").returncode == USAGE


# -- diag export -------------------------------------------------------------------------------------------------
def test_export_makes_the_folder_of_its_output(tmp_path):
    out = tmp_path / "out" / "deeper" / "run1.json"
    result = diag("export", SAMPLES / "straggler", "--perfetto", out)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["traceEvents"]


def test_export_ranks_the_run_does_not_have_are_an_input_error(tmp_path):
    out = tmp_path / "run1.json"
    result = diag("export", SAMPLES / "straggler", "--perfetto", out, "--ranks", "1,9")
    assert result.returncode == USAGE
    assert "no rank 9" in result.stderr and "ranks 0-2" in result.stderr
    assert not out.exists()
    assert diag("export", SAMPLES / "straggler", "--perfetto", out, "--ranks", "x").returncode == USAGE


def test_export_an_output_that_cannot_be_written_is_an_input_error(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = diag("export", SAMPLES / "straggler", "--perfetto", tmp_path / "a-file" / "run1.json")
    assert result.returncode == USAGE and "Traceback" not in result.stderr


# -- interval options --------------------------------------------------------------------------------------------
INTERVAL_OPTIONS = {
    "triage --interval": ["triage", "--watch", "--interval"],
    "triage --stall-s": ["triage", "--watch", "--stall-s"],
    "telemetry --interval": ["telemetry", "--prometheus-port", "1", "--interval"],
    "dashboard --refresh-s": ["dashboard", "--refresh-s"],
}


@pytest.mark.timeout(60)  # without the check, 0 and nan were a busy loop that never ended
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e400", "soon"])
@pytest.mark.parametrize("option", sorted(INTERVAL_OPTIONS))
def test_interval_options_refuse_values_that_crash_or_spin(option, value, tmp_path):
    """nan and inf were tracebacks (sleep, Event.wait), 0 and below a busy loop: now a usage error at once (in
    this process: the option is checked before the command starts)."""
    from click.testing import CliRunner

    from diag.cli import main

    result = CliRunner().invoke(main, [*INTERVAL_OPTIONS[option], value, str(tmp_path)])
    assert result.exit_code == USAGE, result.output
    assert "is not a number of seconds" in result.output
    assert isinstance(result.exception, SystemExit)  # click's usage error, not a traceback


# -- the cached report's path ------------------------------------------------------------------------------------
def test_a_report_from_the_cache_names_the_path_asked_for(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(SAMPLES / "straggler", work / "traces" / "demo")
    first = diag("analyze", "traces/demo", "--fail-on", "never", cwd=work)
    assert first.returncode == 0 and "trace: traces/demo " in first.stdout
    again = diag("analyze", "work/traces/demo", "--fail-on", "never", cwd=tmp_path)
    assert "report read from the cache" in again.stderr
    assert "trace: work/traces/demo " in again.stdout
    report = json.loads(diag("analyze", work / "traces" / "demo", "--format", "json", "--fail-on", "never").stdout)
    assert report["run"]["path"] == str(work / "traces" / "demo")
