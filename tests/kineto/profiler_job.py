"""A real 2-rank gloo DDP job under torch.profiler, for the Kineto import tests. Each rank exports its own
``rankN.pt.trace.json`` (Kineto JSON, with ``distributedInfo``) and writes what the job itself measured,
independently of the profiler, to ``truth_rankN.json``: the profiler step numbers and each step's wall time.

usage: profiler_job.py OUT_DIR SLOW_RANK   (SLOW_RANK: a rank that sleeps 20 ms per step, -1 for none)
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

out, slow_rank = Path(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)), bucket_cap_mb=0.05
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [torch.randn(32, 64) for _ in range(8)]
steps = []  # (profiler step number, wall time of the step body in us)
sched = schedule(wait=1, warmup=1, active=5, repeat=1)
with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
    for batch in batches:
        number = prof.step_num
        start = time.perf_counter_ns()
        if rank == slow_rank:
            time.sleep(0.02)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(torch.ones(1000))  # an explicit blocking collective as well as DDP's buckets
        steps.append((number, (time.perf_counter_ns() - start) / 1e3))
        prof.step()
prof.export_chrome_trace(str(out / f"rank{rank}.pt.trace.json"))
(out / f"truth_rank{rank}.json").write_text(json.dumps({"steps": steps}))
dist.destroy_process_group()
