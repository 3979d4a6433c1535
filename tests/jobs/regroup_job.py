"""A real gloo job that ends its process groups and makes new ones mid-run (elastic re-initialisation, or a job
that re-creates its groups after a failure): 16 steps, ``destroy_process_group()``, a new
``init_process_group``, 14 more steps. Each step runs a DDP model (its gradient buckets issued from C++, read
from Flight Recorder on gloo) and one explicit all_reduce.

usage: regroup_job.py TRACE_DIR SECOND_PORT [unseen]   (unseen: destroy_process_group bound before diag.init,
so that no wrapper of diag's sees the call)
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

import diag

trace_dir, second_port = sys.argv[1], int(sys.argv[2])
destroy_process_group = dist.destroy_process_group  # bound now: diag's wrapper, installed at init, is not it
timeout = datetime.timedelta(seconds=60)
dist.init_process_group("gloo", timeout=timeout)
rank, world = dist.get_rank(), dist.get_world_size()
diag.init(trace_dir, telemetry=False, watchdog=False)


def train(steps: range) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 8), bucket_cap_mb=0.001)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    for step in steps:
        with diag.step(step):
            model(torch.randn(4, 32)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            dist.all_reduce(torch.ones(16))


train(range(16))
if sys.argv[3:] == ["unseen"]:
    destroy_process_group()
else:
    dist.destroy_process_group()
# a store of its own: the launcher's store still holds the first group's keys
address = os.environ.get("MASTER_ADDR", "127.0.0.1")
dist.init_process_group(
    "gloo", init_method=f"tcp://{address}:{second_port}", rank=rank, world_size=world, timeout=timeout
)
train(range(16, 30))
diag.finish()
dist.destroy_process_group()
