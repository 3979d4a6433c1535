"""What `diag triage` says to do next (diag/triage/action.py): fix the code, restart, or evict, with the hosts
and GPUs concerned. End to end on the bundled hang and in the fault sample (tests/faults: each triage fault's
expected action); here each rule on verdicts built around it."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from diag.trace.records import Heartbeat
from diag.triage.action import decide
from diag.triage.analysis import RankReport, Verdict


def _rank(host="node1", gpu=None, dumped=True, exit_how=None, error=None):
    beat = Heartbeat.from_json({"exit": {"how": exit_how, "error": error}}) if exit_how else None
    return SimpleNamespace(
        host=host, gpu=gpu, stall_dump=object() if dumped else None, fatal_stacks=None, has_data=True, heartbeat=beat
    )


def _data(ranks: dict, errors: pd.DataFrame | None = None):
    return SimpleNamespace(ranks=ranks, errors=errors if errors is not None else pd.DataFrame(columns=["rank"]))


def _verdict(kind: str, culprits: list[int], states: dict[int, str]) -> Verdict:
    return Verdict(kind, culprits, None, {r: RankReport(s) for r, s in states.items()}, [])


def test_a_desync_or_deadlock_is_the_codes():
    data = _data({0: _rank(), 1: _rank("node2")})
    for kind in ("desync", "deadlock"):
        action = decide(_verdict(kind, [1], {0: "waiting_in_collective", 1: "waiting_in_collective"}), data)
        assert action.kind == "fix_code" and action.hosts == ["node2"]


def test_a_rank_its_own_code_kept_away_is_the_codes_and_a_frozen_one_is_evicted():
    states = {0: "waiting_in_collective", 1: "stuck_in_compute"}
    busy = decide(_verdict("missing_ranks", [1], states), _data({0: _rank(), 1: _rank("node2")}))
    assert busy.kind == "fix_code"
    frozen = decide(_verdict("missing_ranks", [1], states), _data({0: _rank(), 1: _rank("node2", dumped=False)}))
    assert frozen.kind == "evict" and frozen.hosts == ["node2"] and "stopped answering" in frozen.why
    # no rank dumped at all (the watchdog off): nothing says the process froze
    quiet = decide(_verdict("missing_ranks", [1], states), _data({0: _rank(dumped=False), 1: _rank(dumped=False)}))
    assert quiet.kind == "fix_code"


def test_a_killed_rank_is_restarted_and_one_that_raised_is_the_codes():
    states = {0: "waiting_in_collective", 1: "dead"}
    killed = decide(_verdict("dead_rank", [1], states), _data({0: _rank(), 1: _rank("node2", exit_how="terminated")}))
    assert killed.kind == "restart" and killed.hosts == ["node2"]
    raised = decide(
        _verdict("dead_rank", [1], states),
        _data({0: _rank(), 1: _rank("node2", exit_how="exception", error="ValueError: bad batch")}),
    )
    assert raised.kind == "fix_code"


def test_a_missing_rank_that_raised_its_own_error_is_the_codes_and_a_network_error_is_not():
    """It never reached the collective because it raised: the job's failure. A rank that raised NCCL's
    transport error was itself failed by a peer or the network: nothing says the code."""
    states = {0: "waiting_in_collective", 1: "exited"}
    own = decide(
        _verdict("missing_ranks", [1], states),
        _data({0: _rank(), 1: _rank("node2", exit_how="exception", error="RuntimeError: planted failure")}),
    )
    assert own.kind == "fix_code" and own.hosts == ["node2"] and "error of its own" in own.why
    network = "DistBackendError: NCCL error: remote process exited or there was a network error, ncclRemoteError"
    reached = decide(
        _verdict("missing_ranks", [1], states),
        _data({0: _rank(), 1: _rank("node2", exit_how="exception", error=network)}),
    )
    assert reached.kind == "restart"


def test_a_restarted_job_s_missing_rank_is_judged_by_the_error_it_recorded():
    """torchrun --max-restarts: the later attempt's clean exit replaced the exit record of the attempt judged;
    the error the rank recorded in it (its data loader's) says the job's own failure."""
    states = {0: "waiting_in_collective", 1: "finished"}
    errors = pd.DataFrame(
        [
            {"rank": 0, "time_us": 2.0, "error": "RuntimeError: Connection closed by peer"},
            {"rank": 1, "time_us": 1.0, "error": "RuntimeError: injected fault in data"},
        ]
    )
    ranks = {0: _rank(exit_how="finished"), 1: _rank("node2", exit_how="finished")}
    action = decide(_verdict("missing_ranks", [1], states), _data(ranks, errors))
    assert action.kind == "fix_code" and action.hosts == ["node2"]


def test_an_error_only_a_gpu_gives_evicts_that_gpu():
    states = {0: "waiting_in_collective", 1: "dead"}
    ranks = {
        0: _rank(gpu="GPU-aaa"),
        1: _rank(
            "node2",
            gpu="GPU-bbb",
            exit_how="exception",
            error="RuntimeError: CUDA error: uncorrectable ECC error encountered",
        ),
    }
    action = decide(_verdict("dead_rank", [1], states), _data(ranks))
    assert (action.kind, action.hosts, action.gpus) == ("evict", ["node2"], ["GPU-bbb"])
    assert "uncorrectable ECC" in action.why
    errors = pd.DataFrame([{"rank": 1, "step": 4, "error": "NCCL error: unhandled system error, Xid 79"}])
    stepped = decide(_verdict("step_error", [1], {0: "finished", 1: "finished"}), _data(ranks, errors))
    assert stepped.kind == "evict"


def test_a_hang_inside_a_collective_is_restarted_on_every_members_host():
    states = {0: "stuck_in_collective", 1: "stuck_in_collective"}
    action = decide(_verdict("collective_hang", [], states), _data({0: _rank("node1"), 1: _rank("node2")}))
    assert action.kind == "restart" and action.hosts == ["node1", "node2"]


def test_nothing_to_do_for_a_slow_or_healthy_job():
    for kind in ("no_problem", "slow", "capture_stopped"):
        assert decide(_verdict(kind, [], {0: "finished"}), _data({0: _rank()})).kind == "none"


@pytest.mark.parametrize(
    ("error", "own"),
    [
        ("RuntimeError: planted failure: CPUOffload needs a CUDA device", True),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer", False),
        ("RuntimeError: Timed out waiting 6000ms for recv operation to complete", False),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited "
            "or there was a network error, NCCL version 2.21.5 ncclRemoteError",
            False,
        ),
        ("", False),
    ],
)
def test_an_error_of_the_rank_s_own_is_told_from_a_peer_s_failure_reaching_it(error, own):
    from diag.triage.errors import is_own_error

    assert is_own_error(error) is own


def test_a_missing_rank_that_finished_is_the_code_s():
    """A rank ran diag.finish while the others waited for it in a collective, with no error recorded (it caught
    one between steps, or its loader ran out first): its loop ended early, which a restart repeats."""
    states = {0: "waiting_in_collective", 1: "finished"}
    action = decide(_verdict("missing_ranks", [1], states), _data({0: _rank(), 1: _rank("node2", exit_how="finished")}))
    assert action.kind == "fix_code" and action.hosts == ["node2"]
    assert "loop ended early" in action.why


def test_a_dead_rank_whose_process_exited_on_its_own_is_the_code_s():
    """sys.exit in the user's handler (an exception caught between steps): no signal, no exception reached the
    watchdog, only an exit without diag.finish while the others waited for the rank."""
    states = {0: "waiting_in_collective", 1: "dead"}
    ranks = {0: _rank(), 1: _rank("node2", exit_how="exited_without_finish")}
    action = decide(_verdict("dead_rank", [1], states), _data(ranks))
    assert action.kind == "fix_code" and action.hosts == ["node2"]
