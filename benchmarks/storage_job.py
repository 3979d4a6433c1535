"""A 2-rank gloo DDP job captured by diag, for benchmarks/bench_storage.py: real collective records on disk.

usage: storage_job.py TRACE_DIR STEPS STEP_MS TRACE_FORMAT

Every gradient bucket is timed by diag's DDP communication hook (as on NCCL: each row has a duration), with
small buckets so a step issues several all-reduces; STEP_MS of sleep in each step spaces the steps as a real
job's are, so each 0.5 s flush holds what a real one would. Rank 0 prints, as JSON, the bytes diag's writer
put into each table's live files before finish (the Arrow streams, for format 2), which is what a job killed
before finish would leave for them.
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

import diag


def main(trace_dir: str, steps: int, step_ms: float, trace_format: int) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(8)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())], torch.nn.Linear(256, 1))
    session = diag.init(trace_dir, telemetry=False, watchdog=False, ddp_buckets="hook", trace_format=trace_format)
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    diag.instrument(model, optimizer)
    for batch in diag.wrap_loader([torch.randn(32, 256) for _ in range(steps)]):
        with diag.step():
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(step_ms / 1e3)
    session.writer.flush()
    live_bytes = dict(session.writer.bytes_written)
    diag.finish()
    if dist.get_rank() == 0:
        print(json.dumps(live_bytes))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
