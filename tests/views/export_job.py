"""A real 2-rank DDP job (gloo, CPU) captured by diag with small segments, for the windowed export tests.

usage: export_job.py TRACE_DIR STEPS {finish,killed}

A short job's tables stay far below the sizes capture compacts at (65,536 rows, in row groups of 16,384), so
here the same writer compacts a table's live Arrow stream every 24 rows into Parquet row groups of 8 rows, and
flushes every 10 ms (each step's rows reach the stream as their own record batch, as at scale). ``finish``
ends with ``diag.finish()`` (every table compacted: several Parquet segments of several row groups);
``killed`` leaves without it, as a SIGKILL would (the last segment of each table stays a live stream of one
record batch per flush).
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import diag
from diag.trace import columnar

trace_dir, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
columnar.ROW_GROUP_ROWS = 8
columnar.StreamSegmentWriter.__init__.__defaults__ = (24,)  # compact_rows: the writer builds its segments so
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
diag.init(trace_dir, telemetry=False, flush_interval_s=0.01)
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.005)  # two all_reduce buckets a step
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
diag.instrument(model, optimizer)
for batch in diag.wrap_loader([torch.randn(16, 32) for _ in range(steps)]):
    with diag.step(samples=16):
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        # DDP's buckets reach the trace with the Flight Recorder follower's reads (a second apart, more under
        # load: one read can carry every bucket of the job); a Python-side collective is written at the next
        # flush, so the collectives table fills step by step and compacts into several segments at any load
        dist.all_reduce(torch.ones(1))
    time.sleep(0.03)  # a flush between steps
dist.barrier()
if mode == "killed":
    time.sleep(0.3)  # the writer's last flushes: what a SIGKILL leaves is what was flushed
    os._exit(0)
diag.finish()
dist.destroy_process_group()
