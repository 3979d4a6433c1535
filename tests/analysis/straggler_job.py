"""A small DDP job (gloo, CPU) captured by diag as the README says, for the straggler-cost and crash tests.

usage: straggler_job.py TRACE_DIR STEPS SLOW_RANK {none,sleep,raise} EXTRA_MS [BUCKET_CAP_MB]

* ``sleep``: SLOW_RANK sleeps EXTRA_MS in its model's forward every step (the planted straggler).
* ``raise``: SLOW_RANK raises a RuntimeError in its forward at step 2, ends with it (a crashed rank); the
  others then fail in the gradient all-reduce when its connection closes.
* ``none``: the baseline, every rank alike.

BUCKET_CAP_MB (DDP's, default 25) splits the gradients into several all-reduce buckets when small.

Rank 0 prints, as JSON, the wall-clock time of each step measured here with perf_counter (not by diag), so a
test can compare diag's straggler cost with the slowdown the job really had.
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

import diag

FAIL_AT_STEP = 2


class Planted(torch.nn.Module):
    """The model's forward, with the planted sleep or error on the slow rank."""

    def __init__(self, inner: torch.nn.Module, mode: str, extra_ms: float):
        super().__init__()
        self.inner, self.mode, self.extra_ms = inner, mode, extra_ms
        self.calls = 0

    def forward(self, x):
        if self.mode == "sleep":
            time.sleep(self.extra_ms / 1e3)
        if self.mode == "raise" and self.calls == FAIL_AT_STEP:
            raise RuntimeError("planted failure: CPUOffload needs a CUDA device")
        self.calls += 1
        return self.inner(x)


def main(trace_dir: str, steps: int, slow_rank: int, mode: str, extra_ms: float, bucket_cap_mb: float) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    diag.init(trace_dir, telemetry=False, hang_threshold_s=300)
    planted = Planted(inner, mode if rank == slow_rank else "none", extra_ms)
    model = torch.nn.parallel.DistributedDataParallel(planted, bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    batches = [torch.randn(16, 32) for _ in range(steps)]
    step_s = []
    for batch in diag.wrap_loader(batches):
        started = time.perf_counter()
        with diag.step(samples=len(batch)):
            time.sleep(0.01)  # the model's "real" work: a sleep, so 8 ranks on 2 cores still keep time
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        step_s.append(time.perf_counter() - started)
    diag.finish()
    if rank == 0:
        print(json.dumps({"step_s": step_s}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    trace_dir, steps, slow_rank, mode, extra_ms = sys.argv[1:6]
    main(
        trace_dir, int(steps), int(slow_rank), mode, float(extra_ms), float(sys.argv[6]) if len(sys.argv) > 6 else 25.0
    )
