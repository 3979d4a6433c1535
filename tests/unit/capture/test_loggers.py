"""diag's per-step series reach TensorBoard and Weights & Biases: a real single-process session logs to a real
SummaryWriter and to a real W&B run in offline mode, and the files they write are read back (TensorBoard's
EventAccumulator; W&B's run file, whose records are read with its own protobuf definitions) against the
trace diag wrote for the same steps."""

from __future__ import annotations

import pytest

import diag
from diag._warn import DiagWarning
from tests.capture.loggers_train import STEPS, train


def test_tensorboard_gets_the_step_series(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = train(tmp_path / "trace", tensorboard=tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    loss = events.Scalars("diag/loss")
    assert [e.step for e in loss] == list(range(STEPS))
    assert [e.value for e in loss] == pytest.approx(losses, rel=1e-6)
    steps = diag.load(tmp_path / "trace").steps
    step_time = [e.value for e in events.Scalars("diag/step_time_s")]
    assert step_time == pytest.approx((steps["duration_us"] / 1e6).tolist(), rel=1e-6)
    assert diag.load(tmp_path / "trace").manifest(0).capture["tensorboard"].startswith("on")


def test_a_logger_that_cannot_start_is_one_warning_and_capture_goes_on(tmp_path):
    with pytest.warns(DiagWarning, match="WandbLogger is off"):
        train(tmp_path / "trace", wandb=True)  # no active W&B run in this process
    trace = diag.load(tmp_path / "trace")
    assert len(trace.steps) == STEPS and trace.manifest(0).capture["wandb"].startswith("off: no active W&B run")


def test_tensorboard_gets_mfu_and_problems_as_they_happen(tmp_path):
    """MFU by the report's formula when the step's FLOPs and the device's peak are known, and a NaN loss as a
    count and a line of text at its step, read back from the event files."""
    pytest.importorskip("tensorboard")
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    diag.init(
        tmp_path / "trace",
        telemetry=False,
        watchdog=False,
        tensorboard=tmp_path / "tb",
        flops_per_step=2e9,
        peak_tflops=1.0,
    )
    for step in range(STEPS):
        with diag.step():
            loss = torch.tensor(float("nan") if step == 3 else 1.0)
            diag.record(loss=loss)
    diag.finish()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    steps = diag.load(tmp_path / "trace").steps
    expected_mfu = 2e9 / ((steps["duration_us"] + steps["data_wait_us"]) / 1e6) / 1e12
    assert [e.value for e in events.Scalars("diag/mfu")] == pytest.approx(expected_mfu.tolist(), rel=1e-6)
    nonfinite = events.Scalars("diag/events/nonfinite")
    assert [(e.step, e.value) for e in nonfinite] == [(3, 1.0)]
    texts = events.Tensors("diag/events/text_summary")
    assert [t.step for t in texts] == [3]
    assert b"nonfinite" in texts[0].tensor_proto.string_val[0]
