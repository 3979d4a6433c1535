"""A small DDP job (gloo, CPU) that records its loss and gradient norm with diag.record, with one planted
training-health fault, for tests/integration/analysis/test_health.py.

usage: health_job.py TRACE_DIR STEPS {none,nan,spike,desync,skip_allreduce} RANK STEP

* ``nan``: RANK's batch at STEP holds a NaN: its loss is NaN, and the all-reduce spreads NaN gradients to all.
* ``spike``: RANK's batch at STEP is scaled 30x: its loss jumps at that step only.
* ``desync``: after STEP's optimizer step RANK nudges one weight (as a skipped all-reduce or a faulty device
  would leave it): the replicas hold different parameters from then on.
* ``skip_allreduce``: at STEP, RANK's DDP communication hook still joins the gradient all-reduce (so no rank
  hangs) but keeps its own local gradients instead of the average, as a rank whose all-reduce was skipped would:
  its update differs from its peers' from that step on.
* ``none``: healthy.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

import diag


def keep_local_gradients_at(skip_step: int):
    """DDP's averaging all-reduce, except at ``skip_step``: the all-reduce still runs (the other ranks are in
    it) but this rank keeps its local gradients."""

    def hook(state, bucket):
        local = bucket.buffer().clone()
        averaged = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
        if state["step"] == skip_step:
            return averaged.then(lambda _fut: local)
        return averaged.then(lambda fut: fut.value()[0])

    return hook


def main(trace_dir: str, steps: int, plant: str, plant_rank: int, plant_step: int) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    diag.init(trace_dir, telemetry=False, hang_threshold_s=300, fingerprint_every=1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    current = {"step": -1}
    if plant == "skip_allreduce" and rank == plant_rank:
        ddp.register_comm_hook(current, keep_local_gradients_at(plant_step))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    diag.instrument(ddp, optimizer)
    generator = torch.Generator().manual_seed(1000 + rank)
    target = torch.nn.Linear(16, 1)
    for step in range(steps):
        current["step"] = step
        with diag.step(samples=32):
            x = torch.randn(32, 16, generator=generator)
            with torch.no_grad():
                y = target(x)
            if rank == plant_rank and step == plant_step:
                if plant == "nan":
                    x[0, 0] = float("nan")
                elif plant == "spike":
                    x, y = x * 30, y * 30
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=1e9)
            optimizer.step()
            if plant == "desync" and rank == plant_rank and step == plant_step:
                with torch.no_grad():
                    model[0].weight[0, 0] += 1e-3
            diag.record(loss=loss, grad_norm=grad_norm)
    diag.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
