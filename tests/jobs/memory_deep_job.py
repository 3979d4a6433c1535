"""A real 2-rank gloo DDP job for the deep memory mode; rank r trains on a batch of BATCH * (r + 1) samples, so
its activations at the peak are (r + 1) times rank 0's.

usage: memory_deep_job.py TRACE_DIR STEPS [env]   (env: the deep steps come from DIAG_MEMORY_DEEP_STEPS, set
by the test, instead of diag.init's memory_deep_steps=DEEP_STEPS)

The model: Linear(IN, IN) "embed", Linear(IN, WIDE) "wide", ReLU "act", Linear(WIDE, 1) "head"; plain SGD (no
optimizer state), so the peak is in the forward or backward and the widest activations (WIDE per sample) hold it.
"""

import sys

import torch
import torch.distributed as dist

import diag

IN, WIDE, BATCH = 32, 2048, 64
DEEP_STEPS = (2, 2)
trace_dir, steps = sys.argv[1], int(sys.argv[2])
from_env = len(sys.argv) > 3 and sys.argv[3] == "env"
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(IN, IN)
        self.wide = torch.nn.Linear(IN, WIDE)
        self.act = torch.nn.ReLU()
        self.head = torch.nn.Linear(WIDE, 1)

    def forward(self, x):
        return self.head(self.act(self.wide(self.embed(x))))


options = {} if from_env else {"memory_deep_steps": DEEP_STEPS}
diag.init(trace_dir, telemetry=False, watchdog=False, **options)
model = torch.nn.parallel.DistributedDataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
diag.instrument(model, optimizer)
for _ in range(steps):
    with diag.step():
        x = torch.randn(BATCH * (rank + 1), IN)
        torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
        optimizer.step()
        optimizer.zero_grad()
diag.finish()
dist.barrier()
dist.destroy_process_group()
