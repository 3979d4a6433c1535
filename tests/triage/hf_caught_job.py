"""One rank of a 2-rank Hugging Face ``Trainer`` run (CPU, gloo DDP) whose slow rank computes past the collective
timeout in one training step; the user's script catches the error ``trainer.train()`` raises. diag captures it
through ``DiagTrainerCallback``, which records the failed step and finishes its session when a step raises.

The script sets up the default group itself with a long timeout (the Trainer then uses it as it is): rendezvous,
the Trainer's setup and DDP's first broadcast wait for a rank a loaded machine started late. The Trainer hands
DDP no process group of the user's, so the short timeout is set on the default group once training begins
(``on_train_begin``, after that setup): only the planted delay exceeds it.

Run one process per rank with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
``python hf_caught_job.py TRACE_DIR``, CAUGHT_BAD_RANK and CAUGHT_PG_TIMEOUT_S in the environment.
"""

import datetime
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from caught_job import BAD_STEP, LATE_MARGIN_S, SETUP_TIMEOUT_S, busy_compute  # beside this script
from transformers import Trainer, TrainerCallback, TrainingArguments

from diag.integrations.huggingface import DiagTrainerCallback

BAD_RANK = int(os.environ.get("CAUGHT_BAD_RANK", "1"))
PG_TIMEOUT_S = float(os.environ.get("CAUGHT_PG_TIMEOUT_S", "4"))


class Regression(torch.nn.Module):
    """A model as the Trainer expects one: keyword inputs, a ``loss`` in its output. The bad rank's forward of
    step BAD_STEP computes past the timeout."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.calls = 0

    def forward(self, x, labels):
        if dist.get_rank() == BAD_RANK and self.calls == BAD_STEP:
            busy_compute(PG_TIMEOUT_S + LATE_MARGIN_S)
        self.calls += 1
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


class ShortTimeoutOnceTraining(TrainerCallback):
    """The training collectives' timeout, set on the default group after the Trainer's setup."""

    def on_train_begin(self, args, state, control, **kwargs):
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=PG_TIMEOUT_S))


def main() -> None:
    warnings.filterwarnings("ignore")
    trace_dir = sys.argv[1]
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=SETUP_TIMEOUT_S))
    x = torch.randn(128, 32)
    data = [{"x": row, "labels": row.sum(dim=0, keepdim=True)} for row in x]
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf_caught_"),
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=8,
        max_steps=BAD_STEP + 3,
        logging_steps=1000,  # no loss gathered across ranks mid-run
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    callbacks = [
        ShortTimeoutOnceTraining(),
        DiagTrainerCallback(trace_dir, telemetry=False, hang_threshold_s=2.0, heartbeat_interval_s=0.5),
    ]
    trainer = Trainer(model=Regression(), args=args, train_dataset=data, callbacks=callbacks)
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - the user's handler around train
        print(f"rank {dist.get_rank()}: training failed: {exc}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
