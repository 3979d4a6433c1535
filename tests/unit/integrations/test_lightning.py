"""DiagCallback in real Lightning fits: a 2-rank DDP job (ranks started with torchrun's variables) with
gradient accumulation, and single-process fits in this process."""

import warnings

import pytest

pytest.importorskip("lightning")

import diag  # noqa: E402
from diag._warn import DiagWarning  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402
    assert_phases_inside_steps,
    rank_steps,
)
from tests.integrations.lightning_job import BATCH, fit  # noqa: E402

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
