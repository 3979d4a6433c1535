"""A crashed run is reported as a crash, with the exception, and its failed steps never make a straggler.

The real case: FSDP1 with CPUOffload on CPU-only torch failed in step 0 and `diag analyze` said "[high] Rank 0
is a persistent straggler (compute) +72%" without a word about the crash. Here a real 3-rank gloo DDP job
raises in rank 1's forward at step 2; the other ranks then fail in the gradient all-reduce."""

from __future__ import annotations

import pytest

import diag
from diag.launch import run_ranks
from diag.triage.analysis import triage
from diag.triage.flight_recorder import load_dump
from diag.triage.sources import read_input
from tests.analysis.helpers import PLANTED_JOB, cli_json, run_cli

FAIL_AT_STEP = 2  # straggler_job.py's FAIL_AT_STEP
WORLD = 3


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("crashed")
    results = run_ranks([str(PLANTED_JOB), str(trace_dir), "10", "1", "raise", "0"], WORLD, timeout_s=300)
    assert all(r.returncode not in (0, None) for r in results)  # every rank ended with an error, none hung
    assert "planted failure" in results[1].stderr
    return trace_dir


def test_crash_is_the_first_finding_with_its_exception(crashed_run):
    report = cli_json(crashed_run)
    top = report["findings"][0]
    assert top["kind"] == "crash" and top["severity"] == "high"
    assert top["title"].startswith(f"Rank 1 crashed in step {FAIL_AT_STEP}: RuntimeError")
    assert "planted failure: CPUOffload needs a CUDA device" in top["title"]
    assert top["ranks"] == [0, 1, 2]
    # the others' errors follow it, and say why (the crashed peer closed its connection)
    assert any(e.startswith("then rank 0 in step 2") and "Connection closed" in e for e in top["evidence"])
    first = report["run"]["step_errors"][0]
    assert (first["rank"], first["step"], first["kind"]) == (1, FAIL_AT_STEP, "step_error")
    assert {e["rank"]: e["how"] for e in report["run"]["rank_exits"]} == {
        0: "exception",
        1: "exception",
        2: "exception",
    }
    assert "planted failure" in report["run"]["rank_exits"][1]["error"]


def test_each_rank_wrote_every_collective_its_flight_recorder_holds(crashed_run):
    """An uncaught exception writes the rank's Flight Recorder rows before its dump: a collective in the dump
    but not in the trace would read as one the rank entered and never left."""
    collectives = diag.load(crashed_run).collectives
    for rank in range(WORLD):
        dump = load_dump(crashed_run / f"rank{rank:05d}" / "fr_dump.pkl", rank)
        in_dump = {e.seq for e in dump.entries if e.pg == "0" and not e.is_p2p}
        written = set(collectives.loc[(collectives["rank"] == rank) & (collectives["pg"] == "0"), "seq"].astype(int))
        assert in_dump and in_dump <= written, (rank, sorted(in_dump - written))


def test_the_culprit_raised_first_and_triage_says_fix_the_code(crashed_run):
    """Rank 1 never reached the step's gradient all_reduce the others waited in: it had raised its own error."""
    verdict = triage(read_input(crashed_run))
    assert verdict.culprit_ranks == [1] and verdict.action.kind == "fix_code", (verdict.verdict, verdict.action)


def test_failed_step_is_left_out_and_makes_no_straggler(crashed_run):
    report = cli_json(crashed_run)
    window = report["run"]["window"]
    assert window["failed_steps_excluded"] == [FAIL_AT_STEP]
    assert window["last_step"] < FAIL_AT_STEP
    assert not [f for f in report["findings"] if f["kind"] in ("straggler", "transient_straggler")]
    assert report["stragglers"] == [] and report["straggler_method"]["compared"] is False


def test_text_report_names_the_crash(crashed_run):
    result = run_cli(crashed_run, "--no-cache")
    assert result.exit_code == 0, result.output
    assert "1. [high] Rank 1 crashed in step 2: RuntimeError" in result.stdout
    assert "steps in which a rank raised were left out" in result.stdout
