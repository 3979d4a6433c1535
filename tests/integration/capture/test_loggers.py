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

from tests.capture.loggers_train import STEPS

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
