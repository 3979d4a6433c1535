"""One rank of a 2-rank Lightning DDP fit (CPU, gloo) whose slow rank computes past the collective timeout in
one training step; the user's script catches the error ``trainer.fit`` re-raises (Lightning first calls the
callbacks' ``on_exception``: diag's records the failed step and finishes the session).

The script sets up the default group itself with a long timeout (Lightning then uses it as it is) and hands
DDP a group with the short one: rendezvous and Lightning's setup barriers wait for a rank a loaded machine
started late, and only the planted delay exceeds the training collectives' timeout.

Run one process per rank with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
``python lightning_caught_job.py TRACE_DIR``, CAUGHT_BAD_RANK and CAUGHT_PG_TIMEOUT_S in the environment.
"""

import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist
from caught_job import BAD_STEP, LATE_MARGIN_S, SETUP_TIMEOUT_S, busy_compute  # beside this script
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

from diag.integrations.lightning import DiagCallback

BAD_RANK = int(os.environ.get("CAUGHT_BAD_RANK", "1"))
PG_TIMEOUT_S = float(os.environ.get("CAUGHT_PG_TIMEOUT_S", "4"))


class Regression(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        if self.global_rank == BAD_RANK and self.trainer.global_step == BAD_STEP:
            busy_compute(PG_TIMEOUT_S + LATE_MARGIN_S)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    warnings.filterwarnings("ignore", module="lightning")
    trace_dir = sys.argv[1]
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=SETUP_TIMEOUT_S))
    training_group = dist.new_group(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    x = torch.randn(128, 32)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=DDPStrategy(process_group_backend="gloo", process_group=training_group),
        max_steps=BAD_STEP + 3,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DiagCallback(trace_dir, telemetry=False, hang_threshold_s=2.0, heartbeat_interval_s=0.5)],
    )
    try:
        trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
    except Exception as exc:  # noqa: BLE001 - the user's handler around fit
        print(f"rank {trainer.global_rank}: fit failed: {exc}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
