"""A 2-D device-mesh job (dp x tp, from ``init_device_mesh``) on gloo: tensor parallelism inside each tp group
(``parallelize_module``: DTensor's functional collectives), gradients averaged over the dp group, one planted
fault on one rank.

usage: mesh_job.py TRACE_DIR FAULT RANK   (FAULT: healthy, slow or hang; RANK: where it strikes)
  healthy  every rank trains STEPS steps
  slow     RANK computes SLOW_S more in every step's forward, between its two tensor-parallel layers
  hang     RANK stops in the forward of HANG_STEP and never goes on: its tp peer waits for it in a tensor-parallel
           collective, the others in the dp all_reduce. DeviceMesh gives its groups torch's default timeout (30
           minutes), not the world group's, so nothing times out: the test ends the ranks, as a launcher would
Runs with WORLD_SIZE = DP x TP (4: dp=2 x tp=2; 8: dp=4 x tp=2).
"""

import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import diag

TP = 2
STEPS = 12
SLOW_S = 0.06
HANG_STEP = 4


class SlowBetween(torch.nn.Module):
    """Computes a little more on the planted rank, between the column- and row-parallel layers: its tp peer waits
    for it in the row-parallel layer's all_reduce."""

    def __init__(self, extra_s: float):
        super().__init__()
        self.extra_s = extra_s

    def forward(self, x):
        if self.extra_s:
            time.sleep(self.extra_s)
        return torch.relu(x)


def main() -> None:
    trace_dir, fault, bad_rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    extra_s = SLOW_S if fault == "slow" and rank == bad_rank else 0.0
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), SlowBetween(extra_s), torch.nn.Linear(256, 64))
    model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dp_group = mesh["dp"].get_group()
    diag.init(trace_dir, telemetry=False, hang_threshold_s=2.0, heartbeat_interval_s=0.5)
    diag.instrument(model, optimizer)
    for step in range(STEPS):
        with diag.step():
            if fault == "hang" and rank == bad_rank and step == HANG_STEP:
                threading.Event().wait()
            loss = model(torch.randn(8, 64)).square().mean()
            loss.backward()
            for param in model.parameters():  # data parallel over the dp dimension
                grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                dist.all_reduce(grad, group=dp_group)
                grad /= dp_group.size()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
