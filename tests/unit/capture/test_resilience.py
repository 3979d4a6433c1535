"""Capture never hurts the job: every failure is one warning, the loop goes on, and its results are unchanged."""

import pytest

import diag
from diag.capture import api
from tests.capture.training import reference_losses


def test_user_exceptions_propagate_and_are_recorded(tmp_path):
    diag.init(tmp_path, telemetry=False)
    with pytest.raises(ZeroDivisionError), diag.step():
        1 / 0  # noqa: B018
    diag.finish()
    trace = diag.load(tmp_path)
    assert trace.events["kind"].tolist() == ["step_error"] and "ZeroDivisionError" in trace.events["error"][0]
    assert trace.steps["step"].tolist() == [0]


def test_an_exception_from_the_data_loader_propagates_and_is_recorded(tmp_path):
    def batches():
        yield 1
        raise OSError("shard 7 unreadable")

    diag.init(tmp_path, telemetry=False)
    seen = []
    with pytest.raises(OSError, match="shard 7"):
        for batch in diag.wrap_loader(batches()):
            with diag.step():
                seen.append(batch)
    diag.finish()
    trace = diag.load(tmp_path)
    assert seen == [1]
    assert trace.events["kind"].tolist() == ["data_error"] and "shard 7 unreadable" in trace.events["error"][0]
    assert trace.events["step"].tolist() == [1]  # the step it was loading for


def test_api_before_init_does_nothing():
    assert api.current() is api._DISABLED
    assert reference_losses()  # step, phase, instrument and wrap_loader work without a session
