"""A real Lightning fit (CPU, tiny model) captured by DiagCallback. Rank-count comes from the environment:
run as one plain process, or as ranks started with torchrun's variables (Lightning then joins them instead
of spawning its own). Each rank writes what Lightning says it did to ``TRACE_DIR/truth/rankN.json``.

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

trace_dir, max_steps, accumulate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world = int(os.environ.get("WORLD_SIZE", "1"))
warnings.filterwarnings("ignore", module="lightning")  # its advice about num_workers and logging


class Regression(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        with diag.phase("loss"):  # the user's own phase, inside the step the callback opened
            loss = torch.nn.functional.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
x = torch.randn(256, 32)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
loader = torch.utils.data.DataLoader(data, batch_size=8)  # 32 batches, or 16 per rank with DDP
model = Regression()
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
    callbacks=[DiagCallback(trace_dir, telemetry=False, flops_per_step=1e6)],
)
trainer.fit(model, loader)
rank = trainer.global_rank
os.makedirs(os.path.join(trace_dir, "truth"), exist_ok=True)
with open(os.path.join(trace_dir, "truth", f"rank{rank}.json"), "w") as f:
    json.dump({"global_step": trainer.global_step, "world_size": trainer.world_size, "session_closed": not diag.session().enabled}, f)
