"""DiagCallback in real Lightning fits: a 2-rank DDP job (ranks started with torchrun's variables) with
gradient accumulation, and single-process fits in this process."""

import pytest

pytest.importorskip("lightning")

import warnings

import diag  # noqa: E402
from diag._warn import DiagWarning  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402
    analyze_json,
    assert_phases_inside_steps,
    assert_same_collectives_on_every_rank,
    rank_steps,
    run_job,
)
from tests.integrations.lightning_job import (
    BATCH,  # noqa: E402
    fit,  # noqa: E402
)

WORLD, STEPS, ACCUMULATE = 2, 3, 2


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("lightning_ddp")
    truths = run_job(trace_dir, "lightning_job.py", WORLD, STEPS, ACCUMULATE)
    return trace_dir, diag.load(trace_dir), truths


@pytest.mark.slow
def test_ddp_one_step_per_optimizer_step_on_every_rank(ddp_run):
    _, trace, truths = ddp_run
    assert trace.ranks_found == [0, 1] and trace.skipped == []
    for rank in range(WORLD):
        assert truths[rank]["global_step"] == STEPS and truths[rank]["session_closed"]
        steps = rank_steps(trace, rank)
        assert steps["step"].tolist() == list(range(truths[rank]["global_step"]))
        assert (steps["samples"] == ACCUMULATE * BATCH).all()  # both micro-batches of each step
        assert_phases_inside_steps(steps)
        assert (steps["data_wait_us"] > 0).all()  # Lightning's fetch of each step's batches


@pytest.mark.slow
def test_ddp_user_phase_lands_in_the_step_of_its_micro_batch(ddp_run):
    _, trace, _ = ddp_run
    for rank in range(WORLD):
        phases = trace.phases[trace.phases["rank"] == rank]
        assert set(phases["name"].astype(str)) == {"loss"}
        assert sorted(phases["step"].tolist()) == [s for s in range(STEPS) for _ in range(ACCUMULATE)]


@pytest.mark.slow
def test_ddp_gradient_buckets_recorded_once_per_step_with_all_gradients(ddp_run):
    _, trace, truths = ddp_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ddp = colls[colls["source"] == "ddp"]
        per_step = ddp.groupby("step")["bytes"].sum()
        # no_sync on the first micro-batch: one all-reduce of every gradient per optimizer step
        assert per_step.index.tolist() == list(range(STEPS))
        assert (per_step == truths[rank]["param_bytes"]).all()
        # diag's default on gloo: buckets read from Flight Recorder (untimed), the exposed wait timed per step
        assert ddp["duration_us"].isna().all() and ddp["seq"].is_unique
        assert (trace.steps[trace.steps["rank"] == rank]["comm_wait_us"] > 0).all()
    assert_same_collectives_on_every_rank(trace, WORLD)


@pytest.mark.slow
def test_ddp_manifest_and_analyze(ddp_run):
    trace_dir, trace, _ = ddp_run
    for rank in range(WORLD):
        manifest = trace.manifest(rank)
        assert manifest.rank == rank and manifest.world_size == WORLD and manifest.backend == "gloo"
        assert manifest.finished and manifest.process_groups["0"].ranks == (0, 1)
    assert len({m.run_id for m in trace.manifests.values()}) == 1
    run = analyze_json(trace_dir)["run"]
    assert run["world_size"] == WORLD and run["ranks_found"] == [0, 1] and run["steps"] == STEPS


WORLD, STEPS, ACCUMULATE = 2, 3, 2


def test_single_process_fit_owns_its_session_and_leaves_a_users_session_open(tmp_path):
    trainer = fit(tmp_path / "owned", max_steps=4)
    assert not diag.session().enabled  # the callback finished the session it opened
    trace = diag.load(tmp_path / "owned")
    assert trace.ranks_found == [0] and trace.manifest(0).world_size == 1
    steps = rank_steps(trace, 0)
    assert steps["step"].tolist() == list(range(trainer.global_step)) == [0, 1, 2, 3]
    assert (steps["samples"] == BATCH).all()
    assert_phases_inside_steps(steps)
    assert trace.collectives.empty

    session = diag.init(tmp_path / "users", telemetry=False)
    fit(tmp_path / "ignored", max_steps=2)
    assert diag.session() is session  # used, not finished: the user opened it
    diag.finish()
    assert rank_steps(diag.load(tmp_path / "users"), 0)["step"].tolist() == [0, 1]
    assert not (tmp_path / "ignored").exists()


def test_exception_in_training_step_is_recorded_and_the_session_finished(tmp_path):
    with pytest.raises(RuntimeError, match="planted failure"):
        fit(tmp_path, max_steps=5, fail_at_step=2)
    assert not diag.session().enabled
    trace = diag.load(tmp_path)
    assert rank_steps(trace, 0)["step"].tolist() == [0, 1, 2]  # the failed step's time was spent: written
    assert trace.manifest(0).finished
    errors = trace.events[trace.events["kind"] == "step_error"]
    assert errors["step"].tolist() == [2] and "planted failure" in str(errors["error"].iloc[0])


def test_failure_inside_capture_is_one_warning_and_training_goes_on(tmp_path, monkeypatch):
    from diag.capture.session import Session

    def broken(self, index=None):
        raise OSError("disk on fire")

    monkeypatch.setattr(Session, "begin_step", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, max_steps=3)
    assert trainer.global_step == 3
    ours = [w for w in caught if issubclass(w.category, DiagWarning) and "begin_step" in str(w.message)]
    assert len(ours) == 1
    assert diag.load(tmp_path).steps.empty
