"""A fixed sample of the fault-injection suite (diag/testing/faults.py): real 2- and 3-rank gloo jobs of several
shapes (the exception propagates, is caught before ``diag.finish()``, ``sys.exit`` in the handler,
``diag.Trainer``, a pipeline schedule), with sleep or matmul compute, each with one planted fault, judged by ``diag analyze`` or
``diag triage`` as a user would; the verdict, the culprit and what triage says to do next must all be right.
Every fault kind is here but three whose real jobs tests/integration/triage/test_real_failures.py runs, with
their action (frozen, cross_group, preempted). The whole suite, drawn from a seed over every dimension, with
its accuracy and false-alarm figures: docs/benchmarks.md."""

import pytest

from diag.testing import faults

pytestmark = pytest.mark.slow

S = faults.Scenario
SAMPLE = [
    S("propagate", "sleep", 3, "healthy", faults.NO_WHERE, "none", rank=0, step=0),
    S("propagate", "matmul", 2, "straggler", "forward", "none", rank=1, step=2),
    S("propagate", "sleep", 2, "intermittent", "backward", "none", rank=1, step=2),
    S("finally", "sleep", 2, "memory", "optimizer", "none", rank=0, step=2),
    S("caught_finish", "sleep", 2, "exception", "backward", "none", rank=1, step=2),
    S("trainer", "sleep", 2, "hang", "data", "none", rank=0, step=3),
    S("propagate", "sleep", 3, "sigkill", "collective", "none", rank=2, step=3),
    S("sys_exit", "sleep", 2, "desync", "collective", "none", rank=1, step=2, variant="shape"),
    # a pipeline's waits are sends and receives: no collective is left pending (the stall dumps tell)
    S("pipeline", "sleep", 3, "hang", "forward", "none", rank=1, step=2),
]


@pytest.mark.parametrize("scenario", SAMPLE, ids=[f"{s.kind}@{s.where}-{s.shape}-{s.compute}" for s in SAMPLE])
def test_fault_is_named_with_its_culprit(scenario, tmp_path):
    outcome = faults.run_case(scenario, tmp_path)
    assert outcome.error is None, outcome.error
    assert outcome.verdict_right, f"{scenario.label()}: gave {outcome.given}, wanted {outcome.expected}"
    assert outcome.culprit_right, f"{scenario.label()}: gave {outcome.culprits}, wanted {scenario.expected_culprits}"
    # and what to do about it: fix the code, restart, evict, or nothing
    assert outcome.action_right, f"{scenario.label()}: said {outcome.action}, wanted {scenario.expected_action}"
    if scenario.kind == "healthy":
        assert outcome.false_alarms == []


# the fault kinds whose real jobs, with their action, run in tests/integration/triage/test_real_failures.py
ACTION_CHECKED_ELSEWHERE = {"frozen", "cross_group", "preempted"}


def test_every_fault_kind_has_its_action_checked_on_a_real_job():
    assert {s.kind for s in SAMPLE} | ACTION_CHECKED_ELSEWHERE == set(faults.FAULTS)


def test_scenarios_cover_every_value_of_every_dimension():
    scenarios = faults.draw_scenarios(60, seed=2811)
    assert {s.shape for s in scenarios} == set(faults.SHAPES)
    assert {s.compute for s in scenarios} == set(faults.COMPUTES)
    assert {s.world for s in scenarios} == set(faults.WORLDS)
    assert {s.load for s in scenarios} == set(faults.LOADS)
    assert {s.kind for s in scenarios} == set(faults.FAULTS)
    assert {s.where for s in scenarios} >= {"data", "forward", "backward", "optimizer", "collective", "step0"}
    assert all(s.where in faults.FAULTS[s.kind].wheres for s in scenarios)
    assert faults.draw_scenarios(60, seed=2811) == scenarios  # the seed alone fixes the runs (--resume)


def test_every_fault_has_an_expected_action():
    """Triage is asked what to do on every run: a crash is the code's, a slow, leaking or healthy job has
    nothing to act on."""
    for scenario in faults.draw_scenarios(120, seed=2811):
        assert scenario.expected_action in ("fix_code", "restart", "evict", "none"), scenario.label()
        if scenario.kind == "exception":
            assert scenario.expected_action == "fix_code"
        elif scenario.tool == "analyze":
            assert scenario.expected_action == "none"


def test_caught_error_is_expected_as_the_propagated_one():
    for shape in faults.SHAPES:
        # the forward's all_reduce is on the default group, with the job's timeout, in every shape
        caught = S(shape, "sleep", 4, "hang", "forward", "none", rank=3, step=5)
        assert (caught.tool, caught.expected, caught.expected_culprits) == ("triage", "missing_ranks", [3])
        # ZeRO's groups take torch's 30 min default timeout: a stall before their collectives only slows the job
        later = S(shape, "sleep", 4, "hang", "backward", "none", rank=3, step=5)
        expected = "slow" if shape == "deepspeed" else "missing_ranks"
        assert (later.tool, later.expected, later.expected_culprits) == ("triage", expected, [3])


def test_burners_are_stopped_even_when_the_run_fails():
    with pytest.raises(RuntimeError), faults.burners("2x") as procs:
        pids = [p.pid for p in procs]
        assert len(pids) == 2 * (faults.os.cpu_count() or 1) and all(_alive(pid) for pid in pids)
        raise RuntimeError("the run failed")
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_resume_and_table_read_a_results_file(tmp_path, capsys):
    config = {"runs": 3, "seed": 5, "shapes": ["propagate"], "computes": ["sleep"], "worlds": [2], "loads": ["none"]}
    config.update(kinds=list(faults.FAULTS), compare_pairs=0)
    drawn = faults.draw_scenarios(3, 5, ["propagate"], ["sleep"], [2], list(faults.FAULTS), ["none"])
    outcomes = [
        faults.Outcome(s, s.expected, s.expected, s.expected_culprits, True, True, fault_to_verdict_s=4.0)
        for s in drawn
    ]
    path = tmp_path / "faults.json"
    faults.save_results(path, config, outcomes, [])
    assert faults.main(["--resume", str(path)]) == 0  # every run done: none started again
    _, again, _ = faults.load_results(path)
    assert again == outcomes
    capsys.readouterr()
    assert faults.main(["--table", str(path)]) == 0
    table = capsys.readouterr().out
    assert "| right verdict | 3 / 3 (100.0%) |" in table
    assert "| shape | runs | right verdict | right culprits |" in table and "| propagate | 3 |" in table
