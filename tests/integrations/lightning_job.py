"""A real Lightning fit (CPU, tiny model) captured by DiagCallback: ``fit`` runs it in this process; run as a
script it is one rank of a job started with torchrun's variables (Lightning joins those ranks instead of
spawning its own) and writes what Lightning says it did to ``TRACE_DIR/truth/rankN.json``.

usage: lightning_job.py TRACE_DIR MAX_STEPS ACCUMULATE
"""

import json
import os
import sys
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer

import diag
from diag.integrations.lightning import DiagCallback

BATCH = 8


class Regression(LightningModule):
    def __init__(self, fail_at_step: int | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.fail_at_step = fail_at_step

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.fail_at_step:
            raise RuntimeError("planted failure")
        x, y = batch
        with diag.phase("loss"):  # the user's own phase, inside the step the callback opened
            loss = torch.nn.functional.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def param_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def fit(trace_dir, max_steps: int, accumulate: int = 1, world: int = 1, fail_at_step=None, **options) -> Trainer:
    warnings.filterwarnings("ignore", module="lightning")  # its advice about num_workers and logging
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DiagCallback(trace_dir, telemetry=False, **options)],
    )
    trainer.fit(Regression(fail_at_step), torch.utils.data.DataLoader(data, batch_size=BATCH))
    return trainer


if __name__ == "__main__":
    trace_dir, max_steps, accumulate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    trainer = fit(trace_dir, max_steps, accumulate, int(os.environ["WORLD_SIZE"]), flops_per_step=1e6)
    truth = {
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "param_bytes": param_bytes(trainer.lightning_module),
        "session_closed": not diag.session().enabled,
    }
    os.makedirs(os.path.join(trace_dir, "truth"), exist_ok=True)
    with open(os.path.join(trace_dir, "truth", f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(truth, f)
