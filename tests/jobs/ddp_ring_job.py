"""DDP on gloo with diag's defaults (buckets read from Flight Recorder) for more steps than Flight Recorder's
ring holds: what reaches the trace must have been read while the job ran. Prints the parameter bytes.

usage: ddp_ring_job.py TRACE_DIR STEPS SLEEP_MS   (run with a small TORCH_FR_BUFFER_SIZE)
"""

import sys
import time

import torch
import torch.distributed as dist

import diag

trace_dir, steps, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
diag.init(trace_dir, telemetry=False)
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)  # a few buckets per step
diag.instrument(model)
for _ in range(steps):
    with diag.step():
        model(torch.randn(8, 64)).square().mean().backward()
        time.sleep(sleep_s)
diag.finish()
print(sum(p.numel() * p.element_size() for p in model.parameters()), flush=True)
dist.destroy_process_group()
