"""A one-rank NCCL DDP job on a GPU with capture on, run under torch.cuda's sync debug mode "error", so
that any host-device synchronisation diag added to a step would raise. usage: gpu_job.py TRACE_DIR STEPS"""

import json
import sys

import torch
import torch.distributed as dist

import diag
from diag.capture.flight_recorder import own_dump

trace_dir, steps = sys.argv[1], int(sys.argv[2])
torch.cuda.set_device(0)
dist.init_process_group("nccl")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
diag.init(trace_dir, telemetry_interval_s=0.1, flops_per_step=1e12, dtype="bfloat16")
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
diag.instrument(model, optimizer)
data = [torch.randn(256, 1024, device="cuda") for _ in range(steps)]
torch.cuda.synchronize()
for index, batch in enumerate(diag.wrap_loader(data)):
    if index == 3:  # DDP itself synchronises while it rebuilds its buckets in the first iterations
        torch.cuda.set_sync_debug_mode("error")
    with diag.step(samples=256):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with diag.phase("explicit_all_reduce"):
            dist.all_reduce(torch.ones(1 << 20, device="cuda"))
torch.cuda.set_sync_debug_mode("default")
oom_caught = False
try:
    with diag.step():
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: a real CUDA OOM
except torch.cuda.OutOfMemoryError:
    oom_caught = True
diag.finish()
# NCCL's own CUDA-event durations per collective, from Flight Recorder (our own process: trusted)
fr_durations_ms = {e["collective_seq_id"]: e.get("duration_ms") for e in own_dump()["entries"]}
with open(f"{trace_dir}/truth.json", "w") as f:
    json.dump({"param_bytes": param_bytes, "oom_caught": oom_caught, "fr_durations_ms": fr_durations_ms}, f)
dist.destroy_process_group()
