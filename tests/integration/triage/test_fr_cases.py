"""Flight Recorder verdicts on the hard cases (issue 29 section 2): PyTorch's own analyser tests rebuilt as
NCCL-format dumps, the cases torch's analyser checks (send/recv pairs, coalesced groups, states, all_to_all
split sizes), a rank with no dump, and real torch 2.13 gloo dumps (missing rank, sub-group wait chain, rooted
and uneven collectives) recorded by tests/triage/fr_job.py. The cases live in tests/triage/fr_cases.py;
benchmarks/fr_cases.py scores them against torchfrtrace."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.launch import start_ranks
from diag.triage.analysis import triage
from diag.triage.flight_recorder import load_dump
from diag.triage.sources import read_fr_dir
from tests.triage.fr_cases import FIXTURES, GLOO_EXPECTED, gloo_cases

FR_JOB = Path(__file__).resolve().parents[2] / "triage" / "fr_job.py"


def _run_fr_job(scenario: str, out_dir: Path, timeout_s: float = 240) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = start_ranks([str(FR_JOB), scenario, str(out_dir)], 3, {"TORCH_FR_BUFFER_SIZE": "2000"})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario, verdict, culprits",
    [("subgroup_chain", "missing_ranks", [2]), ("rooted", "no_problem", [])],
)
def test_live_gloo_job_dumps_get_the_verdict(scenario, verdict, culprits, tmp_path):
    """A fresh run of the real job (torch 2.13, gloo, three ranks), judged from its Flight Recorder dumps alone."""
    _run_fr_job(scenario, tmp_path / "dumps")
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["fr_rank_0", "fr_rank_1", "fr_rank_2"]
    result = triage(read_fr_dir(tmp_path / "dumps"))
    assert (result.verdict, result.culprit_ranks) == (verdict, culprits), result.evidence


def test_triage_command_reads_gloo_dumps_without_torch(tmp_path):
    run = next(p for p in sorted(FIXTURES.glob("gloo_missing_rank_*")))
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(run)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr  # a hang verdict is a problem found
    assert result.stdout.startswith("HANG: rank 2 never reached a collective the others are waiting in")


def _judge(case, tmp_path: Path):
    case.write(tmp_path)
    return triage(read_fr_dir(tmp_path))


def test_real_gloo_hang_gets_one_verdict_on_every_run(tmp_path):
    """Runs of one job whose dumps differ in how far gloo's last_completed_collective lags the entries (some
    read seq 8 where the entries reach 9): one verdict, one culprit."""
    lags = set()
    answers = set()
    for case in gloo_cases():
        directory = tmp_path / case.name.replace(" ", "_").replace(":", "").replace("(", "").replace(")", "")
        directory.mkdir()
        verdict = _judge(case, directory)
        answers.add((case.name.rsplit("_", 1)[0], verdict.verdict, tuple(verdict.culprit_ranks)))
        for dump in (load_dump(p) for p in directory.iterdir()):
            top = max((e.seq for e in dump.entries if e.pg == "0"), default=-1)
            lags.add(top - dump.last_completed_seq.get("0", top))
    assert len(answers) == len(GLOO_EXPECTED), answers  # one answer for each job (missing_rank, rooted, ...)
    assert max(lags) >= 1  # the fixtures hold the lag that made the verdict flip
