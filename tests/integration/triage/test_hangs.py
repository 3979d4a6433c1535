"""Real 3-rank gloo jobs that hang in different ways; ``diag triage`` must name verdict, rank and collective.

Each job runs as real processes with an 8 s process-group timeout and a 2 s hang threshold, and is killed
after at most 120 s (see jobs.py). The jobs are run once per module and shared by the tests below.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.triage.jobs import BAD_RANK, collect_fr_dumps, diag_triage_json, run_scenario

pytestmark = pytest.mark.slow
GRAD_WEIGHT_BYTES = 64 * 64 * 4  # the all_reduce of the Linear(64, 64) weight gradient


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def run(scenario: str):
        if scenario not in cache:
            out = tmp_path_factory.mktemp(scenario)
            trace = run_scenario(scenario, out)
            fr_dir = out / "fr"
            collect_fr_dumps(trace, fr_dir)
            cache[scenario] = (trace, fr_dir)
        return cache[scenario]

    return run


def test_healthy_run_reports_no_problem(runs):
    trace, _ = runs("healthy")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "no_problem"
    assert verdict["culprit_ranks"] == []
    assert {r["state"] for r in verdict["ranks"].values()} == {"finished"}


def test_rank_that_skipped_an_all_reduce_is_named_missing(runs):
    trace, _ = runs("skip")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["op"] == "all_reduce"
    assert verdict["collective"]["pg"] == "0"
    assert verdict["ranks"][str(BAD_RANK)]["state"] == "finished"
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"
    # the step at which the ranks fell out of step is found: rank 1 issued step 4's collectives with step 3's
    assert any("rank 1 in step 4" in line for line in verdict["evidence"])


def test_rank_stuck_in_its_data_loader_is_named_with_its_stack(runs):
    trace, _ = runs("loader")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["op"] == "all_reduce"
    assert verdict["collective"]["sizes"] == f"{GRAD_WEIGHT_BYTES} B"
    bad = verdict["ranks"][str(BAD_RANK)]
    assert bad["state"] == "stuck_in_data_loader"
    assert bad["last_step"] == 2 and bad["last_phase"] == "data_wait"
    assert any("hang_job.py" in frame and "__iter__" in frame for frame in bad["stack"])
    assert "SIGTERM" in "\n".join(verdict["evidence"])


def test_culprit_is_the_rank_at_the_end_of_a_wait_chain(runs):
    """Rank 0 waits in the all_reduce for ranks 1 and 2; rank 1 waits in a side-group barrier for rank 2;
    rank 2 is stuck in its data loader."""
    trace, _ = runs("chain")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks"
    assert verdict["culprit_ranks"] == [2]
    assert verdict["collective"]["op"] == "barrier" and verdict["collective"]["pg"] != "0"  # the one rank 2 missed
    assert verdict["ranks"]["1"]["state"] == "waiting_in_collective"  # in the barrier reported
    assert verdict["ranks"]["0"]["state"] == "waiting_in_collective"  # in the all_reduce of group 0
    assert verdict["ranks"]["2"]["state"] == "stuck_in_data_loader"
    evidence = "\n".join(verdict["evidence"])
    assert "rank 1 is itself waiting in barrier" in evidence or "also pending: rank 0 at seq" in evidence


def test_rank_calling_all_gather_instead_of_all_reduce_is_the_desync_culprit(runs):
    trace, _ = runs("desync")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "desync"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["op"] == "all_reduce"  # what the majority issued
    evidence = "\n".join(verdict["evidence"])
    assert "called all_gather" in evidence and "called all_reduce" in evidence
    assert evidence.count("hang_job.py") >= 2  # both call sites


def test_sigkilled_rank_is_named_dead(runs):
    trace, _ = runs("kill")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "dead_rank"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["op"] == "all_reduce"
    assert verdict["ranks"][str(BAD_RANK)]["state"] == "dead"
    assert "no exit record" in verdict["ranks"][str(BAD_RANK)]["detail"]


def test_rank_slow_for_one_step_is_named_slow_not_hung(runs):
    trace, _ = runs("slow")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "slow"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert any("later cleared" in line for line in verdict["evidence"])
    assert {r["state"] for r in verdict["ranks"].values()} == {"finished"}


@pytest.mark.parametrize("scenario", ["skip", "loader", "kill"])
def test_flight_recorder_dumps_alone_name_the_missing_rank(runs, scenario):
    _, fr_dir = runs(scenario)
    verdict = diag_triage_json(fr_dir)
    assert verdict["verdict"] == "missing_ranks"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["op"] == "all_reduce"


def test_flight_recorder_desync_culprit_does_not_depend_on_file_order(runs, tmp_path):
    """torchfrtrace takes the first file it lists as the reference; diag must not."""
    _, fr_dir = runs("desync")
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path  # tmpfs lists newest first
    verdicts, listings = [], []
    for order in ((0, 1, 2), (2, 0, 1)):
        target = Path(tempfile.mkdtemp(dir=base))
        try:
            for rank in order:
                shutil.copyfile(fr_dir / f"fr_trace_{rank}", target / f"fr_trace_{rank}")
            listings.append(os.listdir(target))
            verdicts.append(diag_triage_json(target))
        finally:
            shutil.rmtree(target)
    assert [v["verdict"] for v in verdicts] == ["desync", "desync"]
    assert [v["culprit_ranks"] for v in verdicts] == [[BAD_RANK], [BAD_RANK]]
    if base != tmp_path:
        assert listings[0] != listings[1]  # the two directories really were read in different orders


def test_two_rank_desync_tie_is_broken_by_history_not_by_rank_order(tmp_path):
    """1 rank against 1: the side issuing a collective the group never issued before is the culprit."""
    trace = run_scenario("desync", tmp_path, world_size=2)
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "desync"
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert any("tie" in line for line in verdict["evidence"])


@pytest.mark.parametrize("scenario", ["wide", "narrow"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_dtype_mismatch_gloo_aborts_on_is_a_desync_not_a_dead_rank(tmp_path, scenario, world_size):
    """Rank 1 all-reduces a float64 (wide) or float16 (narrow) tensor where the others pass float32. gloo aborts
    whichever ranks receive more bytes than their own call expects (SIGABRT, the call never recorded): the
    others when rank 1's is wider, rank 1 itself when narrower. Either way the culprit is rank 1."""
    trace = run_scenario(scenario, tmp_path, world_size=world_size)
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "desync" and verdict["culprit_ranks"] == [BAD_RANK], verdict["evidence"]
    evidence = "\n".join(verdict["evidence"])
    # on 3 ranks a rank that survived may have recorded its side of the mismatch: an ordinary desync then
    assert "aborted (SIGABRT) inside all_reduce" in evidence or "culprit: rank 1 called all_reduce" in evidence


def test_text_output_names_verdict_rank_and_collective(runs):
    trace, _ = runs("loader")
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(trace)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr  # a hang verdict (docs/cli.md)
    assert result.stdout.startswith("HANG: rank 1 never reached")
    assert "all_reduce seq" in result.stdout and "stuck_in_data_loader" in result.stdout


def test_triage_command_does_not_import_torch(runs):
    trace, _ = runs("loader")
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        f"r = CliRunner().invoke(main, ['triage', {str(trace)!r}]); "
        "print(r.exit_code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    assert out == ["1", "False"]  # exit status 1: a hang


def test_json_output_has_the_documented_keys(runs):
    trace, _ = runs("loader")
    verdict = diag_triage_json(trace)
    assert set(verdict) >= {"verdict", "culprit_ranks", "collective", "ranks", "evidence"}
    assert set(verdict["collective"]) >= {"pg", "seq", "op", "sizes"}
    assert set(verdict["ranks"]["1"]) >= {"state", "last_step", "last_phase", "stack"}
    json.dumps(verdict)


def test_corrupt_files_in_a_trace_are_reported_and_the_verdict_stands(runs, tmp_path):
    trace, _ = runs("loader")
    copy = tmp_path / "trace"
    shutil.copytree(trace, copy)
    (copy / "rank00000" / "fr_dump.pkl").write_bytes(pickle.dumps({"entries": [os.system]}))  # refers to code
    (copy / "rank00002" / "fr_dump.pkl").write_bytes(b"\x80\x05 truncated")
    verdict = diag_triage_json(copy)
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [BAD_RANK]
    skipped = "\n".join(verdict["skipped"])
    assert "rank00000/fr_dump.pkl: rejected pickle: refused to load posix.system" in skipped
    assert "rank00002/fr_dump.pkl: corrupt pickle" in skipped


def test_directory_with_nothing_usable_says_there_is_nothing_to_judge(tmp_path):
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    (rank_dir / "collectives.csv").write_text("not,a,trace\n")
    result = subprocess.run(
        [sys.executable, "-m", "diag", "triage", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr  # nothing to judge: an input error
    assert result.stdout.startswith("NOTHING TO JUDGE")
    assert "collectives.csv: not a diag trace file" in result.stdout


def _judged(trace: Path, heartbeats: bool) -> tuple[dict, int]:
    """The verdict (its notes on what was read left out: they differ by design) and how many ranks were judged
    from their heartbeats alone."""
    from diag.triage.analysis import triage
    from diag.triage.sources import read_diag_trace

    data = read_diag_trace(trace, heartbeats=heartbeats)
    verdict = triage(data).to_json()
    verdict["evidence"] = [line for line in verdict["evidence"] if line not in data.notes]
    return verdict, sum(info.judged_by_heartbeat for info in data.ranks.values())


def _steps_line(verdict: dict) -> str | None:
    """The seq from which ranks issued one collective in different steps, taken out of the verdict's evidence."""
    lines = [line for line in verdict["evidence"] if line.startswith("from seq ")]
    verdict["evidence"] = [line for line in verdict["evidence"] if line not in lines]
    return lines[0].split(",")[0] if lines else None


def _without_heartbeat_groups(trace: Path, copy: Path) -> Path:
    """The trace as capture wrote it before heartbeats carried ``groups`` (an old trace)."""
    shutil.copytree(trace, copy)
    for path in copy.glob("rank*/heartbeat.json"):
        heartbeat = json.loads(path.read_text())
        assert "groups" in heartbeat, "capture's heartbeat lacks the groups' last collectives"
        heartbeat.pop("groups")
        path.write_text(json.dumps(heartbeat))
    return copy


# how many of the 3 ranks each real job leaves decidable by its heartbeat alone: ranks stalled, or ended after
# a stall, whose groups agree. The data loader and wait-chain hangs: every rank; the healthy and slow jobs
# finished (their verdict may rest on their whole history): none. The skipped all_reduce, the desync and the
# SIGKILL vary with which ranks' watchdogs dumped a stall before their timeouts fired (None: not pinned).
JUDGED_BY_HEARTBEAT = {
    "loader": 3,
    "chain": 3,
    "regroup": 3,
    "reinit": None,
    "healthy": 0,
    "slow": 0,
    "skip": None,
    "desync": None,
    "kill": None,
}


@pytest.mark.parametrize("scenario", sorted(JUDGED_BY_HEARTBEAT))
def test_verdict_from_heartbeats_equals_the_verdict_from_the_tables(runs, scenario, tmp_path):
    trace, _ = runs(scenario)
    from_tables, none = _judged(trace, heartbeats=False)
    from_heartbeats, judged = _judged(trace, heartbeats=True)
    assert none == 0
    assert judged == JUDGED_BY_HEARTBEAT[scenario] or JUDGED_BY_HEARTBEAT[scenario] is None
    # a heartbeat holds a group's last collectives, not the step of each earlier one: where the ranks fell out of
    # step may name fewer ranks when some were judged from it; the seq it names is the same
    steps_line = _steps_line(from_tables)
    assert _steps_line(from_heartbeats) == steps_line
    assert from_heartbeats == from_tables
    old_trace, judged = _judged(_without_heartbeat_groups(trace, tmp_path / "old"), heartbeats=True)
    assert judged == 0  # an old trace's ranks are all judged from their tables
    assert _steps_line(old_trace) == steps_line
    assert old_trace == from_tables


@pytest.mark.parametrize("scenario", sorted(JUDGED_BY_HEARTBEAT))
def test_worker_processes_read_the_same_as_one_process(runs, scenario, tmp_path):
    """A large trace's ranks are read by worker processes (``sources.TailRead`` on the engine's runner): asked for
    here on each real job (3 ranks, two workers), new and old (heartbeats without groups), the read equals the
    inline one's."""
    from tests.triage.helpers import assert_same_read

    trace, _ = runs(scenario)
    assert_same_read(trace, 2)
    assert_same_read(_without_heartbeat_groups(trace, tmp_path / "old"), 2)


def test_rank_whose_reinitialisation_raised_outside_a_step_is_the_failure(runs):
    """Rank 0's re-initialisation raises between steps (the new store's port is taken) and ends it; the others
    wait for its store, outside any collective, until they time out or are stopped. Nothing is pending, no step
    raised: the exception that ended rank 0 is the failure, not "no problem"."""
    trace, _ = runs("reinit")
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "step_error", verdict["evidence"]
    assert verdict["culprit_ranks"] == [0]
    assert verdict["action"] == "fix_code"
    assert "EADDRINUSE" in verdict["evidence"][0] and "outside any step" in verdict["evidence"][0]
    assert verdict["ranks"]["0"]["state"] == "exited"


def test_regrouped_default_group_is_named_once_across_diag_and_flight_recorder(runs):
    """The job destroys its groups after step 0 and makes the default group again: diag's rows name it "0@1",
    the watchdog's Flight Recorder dumps "0" (told apart from the old "0" by its pg_id). Joined, the verdict
    and every rank's detail name one group, and no entry of the new group is read as a pending one of the old."""
    from diag.triage.sources import read_diag_trace

    trace, _ = runs("regroup")
    assert all((trace / f"rank{r:05d}" / "fr_dump.pkl").exists() for r in (0, 2))  # the waiting ranks dumped
    verdict = diag_triage_json(trace)
    assert verdict["verdict"] == "missing_ranks", verdict["evidence"]
    assert verdict["culprit_ranks"] == [BAD_RANK]
    assert verdict["collective"]["pg"] == "0@1" and verdict["collective"]["op"] == "all_reduce"
    assert verdict["ranks"][str(BAD_RANK)]["state"] == "stuck_in_data_loader"
    texts = verdict["evidence"] + [r["detail"] for r in verdict["ranks"].values()]
    assert not [t for t in texts if "process group 0 " in f"{t} " or "group 0;" in t], texts
    for heartbeats in (True, False):
        ops = read_diag_trace(trace, heartbeats=heartbeats).ops
        old = ops[ops["pg"] == "0"]
        assert old["completed"].all(), old  # the old group's collectives all returned before it was destroyed
        new_from_fr = ops[(ops["pg"] == "0@1") & ops["source"].str.startswith("flight_recorder")]
        assert set(new_from_fr["rank"]) <= {0, 2}  # only the waiting ranks' dumps hold entries past diag's rows
