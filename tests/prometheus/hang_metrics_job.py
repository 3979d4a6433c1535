"""A real 2-rank gloo job that hangs, with diag's Prometheus export on: after two healthy steps rank 1 stays
away from step 2's all_reduce (it sleeps) while rank 0 waits inside it, until the test kills the job.

usage: hang_metrics_job.py TRACE_DIR PORT
"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import diag

trace_dir, port = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
diag.init(
    trace_dir,
    telemetry=False,
    prometheus_port=port,
    prometheus_addr="127.0.0.1",
    hang_threshold_s=1.0,
    heartbeat_interval_s=0.2,
    flush_interval_s=0.1,
)
for step in range(3):
    with diag.step():
        if step == 2 and rank == 1:
            time.sleep(600)  # never arrives: the test kills the job
        dist.all_reduce(torch.ones(16))
