"""One NCCL rank on a GPU with capture on: NCCL's log should land in the rank directory. The NCCL communicator
is created at the first collective, after diag.init, as in any job that calls diag.init after
init_process_group. usage: nccl_log_job.py TRACE_DIR"""

import sys

import torch
import torch.distributed as dist

import diag

torch.cuda.set_device(0)
dist.init_process_group("nccl")
diag.init(sys.argv[1], telemetry=False)
for _ in range(3):
    dist.all_reduce(torch.ones(1 << 20, device="cuda"))
torch.cuda.synchronize()
diag.finish()
dist.destroy_process_group()
