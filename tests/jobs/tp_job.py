"""Torch tensor parallelism (``parallelize_module``, ColwiseParallel / RowwiseParallel) on a small MLP, gloo,
for more steps than Flight Recorder's ring holds: DTensor's collectives are issued from C++ (functional
collectives), so only a Flight Recorder read while the job runs sees them. At the end, each rank saves
Flight Recorder's own view of the last steps (step -> collectives issued) for the test to compare.

usage: tp_job.py TRACE_DIR STEPS   (run with a small TORCH_FR_BUFFER_SIZE)
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import diag
from diag.capture.flight_recorder import own_dump

trace_dir, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
diag.init(trace_dir, telemetry=False)
diag.instrument(model, optimizer)
step_windows = []
for _ in range(steps):
    started_ns = time.time_ns()
    with diag.step():
        model(torch.randn(4, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    step_windows.append((started_ns, time.time_ns()))
# what Flight Recorder itself still holds: collectives per step for the steps its ring covers
entries = [e for e in own_dump(stack_traces=False)["entries"] if not e.get("is_p2p")]
oldest_ns = min(e["time_created_ns"] for e in entries)
per_step = {}
for step, (start_ns, end_ns) in enumerate(step_windows):
    if start_ns >= oldest_ns:
        per_step[step] = sorted(e["collective_seq_id"] for e in entries if start_ns <= e["time_created_ns"] <= end_ns)
diag.finish()
with open(os.path.join(trace_dir, f"fr_per_step_{dist.get_rank()}.json"), "w") as f:
    json.dump(per_step, f)
dist.destroy_process_group()
