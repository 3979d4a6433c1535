"""A real 2-rank gloo DDP job with diag's Prometheus export on, for tests/prometheus. Once its steps are done
and flushed it says so (CONTROL_DIR/ready_rankN) and keeps serving until the test has scraped it
(CONTROL_DIR/done), then finishes. What it really did goes to CONTROL_DIR/truth_rankN.json.

usage: prometheus_job.py TRACE_DIR CONTROL_DIR STEPS PORT
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import diag

trace_dir, control, steps, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
session = diag.init(
    trace_dir,
    telemetry=False,
    watchdog=False,
    flops_per_step=2e6,
    peak_tflops=0.5,
    prometheus_port=port,
    prometheus_addr="127.0.0.1",
    flush_interval_s=0.1,
    ddp_buckets="hook",  # every bucket reaches the metrics as it completes (from Flight Recorder they lag)
)
model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
diag.instrument(model, optimizer)

explicit = {"all_reduce": 0, "broadcast": 0}
for batch in diag.wrap_loader([torch.randn(8, 32) for _ in range(steps)]):
    with diag.step(samples=8, tokens=8 * 32):
        with diag.phase("compute"):
            model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(torch.ones(100))
        explicit["all_reduce"] += 1
        dist.broadcast(torch.zeros(10, dtype=torch.float64), src=0)
        explicit["broadcast"] += 1

# Flight Recorder's rows (DDP's constructor broadcasts, its shape check's all_gather) reach the metrics when its
# follower next reads the ring (every ~1 s): read it now, so the scrape sees them whatever the timing
session.recorder.flight_recorder.read(final=True)  # final: every Python-side collective has completed
session.writer.flush()  # everything recorded so far reaches the metrics now, not at the next flush
(control / f"truth_rank{rank}.json").write_text(
    json.dumps({"steps": steps, "explicit": explicit, "status": session.capture_status["prometheus"]})
)
(control / f"ready_rank{rank}").write_text(str(port + session.identity.local_rank))
deadline = time.monotonic() + 120
while not (control / "done").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
diag.finish()
dist.destroy_process_group()
