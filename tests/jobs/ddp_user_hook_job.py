"""DDP on gloo where the user registers their own communication hook AFTER diag.instrument (as PowerSGD or
fp16 compression users do), with diag's hook mode forced (the default on NCCL). Trains a few steps and saves
the final parameters, for comparison with the same job and hook without diag.

usage: ddp_user_hook_job.py TRACE_DIR|none HOOK OUT_PATH   (HOOK: allreduce, fp16, builtin_fp16)
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import diag

trace_dir, hook_name, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)), bucket_cap_mb=0.005
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if trace_dir != "none":
    diag.init(trace_dir, telemetry=False, ddp_buckets="hook")
    diag.instrument(model, optimizer)
if hook_name == "allreduce":
    model.register_comm_hook(None, default_hooks.allreduce_hook)
elif hook_name == "fp16":
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
else:
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
try:  # DDP's own rule stays: a second registration is refused
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    print("second registration accepted", flush=True)
except RuntimeError as exc:
    assert "can only be called once" in str(exc), exc
torch.manual_seed(1 + rank)  # different data on each rank, so that the hook's reduction matters
for _ in range(5):
    with diag.step():
        model(torch.randn(8, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
diag.finish()
if rank == 0:
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out_path)
dist.barrier()
dist.destroy_process_group()
# Skip the interpreter's teardown: with a DDP comm hook on gloo it aborted a rank now and then, after the
# results were saved ("terminate called without an active exception", -6), without diag as well as with it
# (torch's static destructors, not what this test checks). diag.finish has already written everything.
sys.stdout.flush()
os._exit(0)
