"""diag's per-step series reach TensorBoard and Weights & Biases: a real single-process session logs to a real
SummaryWriter and to a real W&B run in offline mode, and the files they write are read back (TensorBoard's
EventAccumulator; W&B's run file, whose records are read with its own protobuf definitions) against the
trace diag wrote for the same steps."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

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


WANDB_JOB = """
import json, sys, wandb
sys.path.insert(0, {repo!r})
from tests.capture.loggers_train import train
run = wandb.init(project="diag-test", dir={wandb_dir!r})
losses = train({trace_dir!r}, wandb=True)
wandb.log({{"user_metric": 1.0}})  # the user's own logging goes on beside diag's
run.finish()
print(json.dumps(losses))
"""


def wandb_history(run_file) -> list[dict]:
    """History rows of a W&B run file: W&B's LevelDB-style log of 32 KiB blocks (7-byte record headers:
    crc32, length, kind), after a 7-byte file header; each record one protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, records, partial = run_file.read_bytes(), 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding to the end of a block
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            partial += chunk
        elif kind == 4:
            records.append(partial + chunk)
            partial = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.mark.slow
def test_wandb_offline_run_gets_the_step_series_against_diag_step(tmp_path):
    pytest.importorskip("wandb")
    from tests.conftest import REPO

    script = WANDB_JOB.format(repo=str(REPO), wandb_dir=str(tmp_path), trace_dir=str(tmp_path / "trace"))
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(out.stdout.strip().splitlines()[-1])
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [r for r in wandb_history(run_file) if "diag/loss" in r]
    assert [r["diag/step"] for r in rows] == list(range(STEPS))
    assert [r["diag/loss"] for r in rows] == pytest.approx(losses, rel=1e-6)
    assert all(r["diag/samples_per_s"] > 0 for r in rows)
    assert any("user_metric" in r for r in wandb_history(run_file))


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
