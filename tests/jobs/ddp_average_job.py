"""Two identical DDP models on each rank, one instrumented by diag (its communication hook averages through
the process group) and one left on DDP's built-in path. Prints, as JSON, whether every gradient of every
step agrees between the two.

usage: ddp_average_job.py TRACE_DIR STEPS
"""

import copy
import json
import sys

import torch
import torch.distributed as dist

import diag

trace_dir, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
diag.init(trace_dir, telemetry=False, ddp_buckets="hook")
instrumented = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.005)
builtin = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.005)
diag.instrument(instrumented)

torch.manual_seed(1 + rank)  # different data on each rank, so that averaging matters
worst = 0.0
for _ in range(steps):
    batch = torch.randn(8, 32)
    with diag.step():
        instrumented(batch).square().mean().backward()
    builtin(batch).square().mean().backward()
    for ours, theirs in zip(instrumented.parameters(), builtin.parameters()):
        worst = max(worst, float((ours.grad - theirs.grad).abs().max() / theirs.grad.abs().max()))
        ours.grad = theirs.grad = None
diag.finish()
print(json.dumps({"rank": rank, "worst_relative_difference": worst}), flush=True)
dist.destroy_process_group()
