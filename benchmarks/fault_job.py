"""One rank of a small data-parallel CPU job over gloo that injects one fault, for ``benchmarks/faults.py``.

Started once per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) as
``python fault_job.py TRACE_DIR`` with the fault in the environment:
  FAULT_KIND     one of FAULTS below
  FAULT_RANK     the rank that misbehaves
  FAULT_STEP     the step where it starts
  FAULT_MODEL    ddp (torch DDP), fsdp2 (fully_shard) or manual (explicit all_reduce per parameter)
  FAULT_PG_TIMEOUT_S, FAULT_HANG_THRESHOLD_S   the collective timeout and diag's stall threshold
The bad rank writes ``TRACE_DIR/fault_at.json`` (wall-clock time of the injection) when the fault starts, and
``TRACE_DIR/ready`` where the driver must act (SIGSTOP, SIGKILL). Every rank computes COMPUTE_S per step (a
sleep standing in for the GPU's work, as the issue's own reproductions do) so a planted delay is a share of a
realistic step.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import diag

STEPS = int(os.environ.get("FAULT_STEPS", "14"))
COMPUTE_S = 0.02
STRAGGLE_S = 0.04  # a persistent straggler's extra time per step: twice the others' compute
SPIKE_S = 0.3  # an intermittent straggler's extra time, every SPIKE_EVERY steps
SPIKE_EVERY = 4
LEAK_BYTES_PER_STEP = 4 * 2**20  # 52 MiB over the run: a clear leak, ~1 ms a step to fill
FAULTS = (
    "healthy",
    "compute",  # persistent compute straggler from FAULT_STEP on
    "data",  # persistent data-loader straggler
    "intermittent",  # a spike every SPIKE_EVERY steps
    "slow_comm",  # the rank's collectives are delayed (host work before each sync)
    "memory",  # memory grows on one rank (a leak)
    "exception",  # one rank raises in a step
    "late",  # one rank computes past the collective timeout, then arrives
    "frozen",  # one rank is SIGSTOPped (driver), SIGCONTed after the timeout
    "sigkill",  # one rank is SIGKILLed (driver) inside a step
    "loader_hang",  # one rank's data loader blocks forever
    "barrier_hang",  # one rank never reaches the step-end barrier (stuck in a loop)
    "desync_op",  # all_gather where the others all_reduce
    "desync_shape",  # a 4x3 tensor where the others all-reduce 3x4 (equal bytes)
    "desync_dtype",  # float64 where the others use float32
    "desync_size",  # 13 elements where the others all-reduce 12
    "cross_group",  # the bad rank and its partner enter two side groups in opposite orders
    "inside",  # the bad rank enters an all_reduce first and is frozen inside it (driver); the others enter
    # 2 s later and time out: every rank entered, none completed (a network- or NCCL-level hang)
    "preempted",  # a healthy job whose every rank gets SIGTERM mid-run (the driver), as on preemption
)


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


KIND = env("FAULT_KIND", "healthy")
BAD_RANK = int(env("FAULT_RANK", "1"))
BAD_STEP = int(env("FAULT_STEP", "3"))
MODEL = env("FAULT_MODEL", "manual")
PG_TIMEOUT_S = float(env("FAULT_PG_TIMEOUT_S", "6"))
HANG_THRESHOLD_S = float(env("FAULT_HANG_THRESHOLD_S", "2"))


def mark(trace_dir: Path, name: str) -> None:
    """Tell the driver when the fault started (and where it must act), atomically."""
    tmp = trace_dir / f".{name}.tmp"
    tmp.write_text(json.dumps({"time_s": time.time(), "pid": os.getpid()}))
    tmp.replace(trace_dir / name)


class Batches:
    def __init__(self, rank: int, trace_dir: Path):
        self.rank, self.trace_dir = rank, trace_dir

    def __iter__(self):
        for step in range(STEPS):
            if self.rank == BAD_RANK and step >= BAD_STEP:
                if KIND == "data":
                    if step == BAD_STEP:
                        mark(self.trace_dir, "fault_at.json")
                    time.sleep(STRAGGLE_S)
                elif KIND == "loader_hang" and step == BAD_STEP:
                    mark(self.trace_dir, "fault_at.json")
                    threading.Event().wait()  # a data loader worker that never answers
            yield torch.randn(16, 64)


def forward_fault(rank: int, step: int, trace_dir: Path, leaked: list) -> None:
    """What the bad rank does inside its forward (time it takes, memory it keeps, an error it raises)."""
    if rank != BAD_RANK or step < BAD_STEP:
        return
    first = step == BAD_STEP
    if KIND == "compute":
        time.sleep(STRAGGLE_S)
    elif KIND == "intermittent" and (step - BAD_STEP) % SPIKE_EVERY == 0:
        time.sleep(SPIKE_S)
    elif KIND == "memory":
        leaked.append(torch.ones(LEAK_BYTES_PER_STEP // 4))  # kept forever, as a leak is
    elif first and KIND == "exception":
        mark(trace_dir, "fault_at.json")
        raise RuntimeError("injected fault: CUDA error: an illegal memory access was encountered")
    elif first and KIND == "late":
        mark(trace_dir, "fault_at.json")
        time.sleep(PG_TIMEOUT_S + 4)  # arrives after the others have timed out
    elif first and KIND in ("frozen", "sigkill"):
        mark(trace_dir, "fault_at.json")
        mark(trace_dir, "ready")
        time.sleep(3600 if KIND == "sigkill" else PG_TIMEOUT_S + 6)  # the driver stops or kills it here
    if first and KIND in ("compute", "intermittent", "memory"):
        mark(trace_dir, "fault_at.json")


def sync_gradients(model, rank: int, step: int, trace_dir: Path, side_groups) -> None:
    """Manual data parallelism: one all_reduce per gradient, where the desync faults go wrong."""
    bad_now = rank == BAD_RANK and step == BAD_STEP
    if KIND == "slow_comm" and rank == BAD_RANK and step >= BAD_STEP:
        if step == BAD_STEP:
            mark(trace_dir, "fault_at.json")
        time.sleep(STRAGGLE_S)  # host work that delays this rank's collectives
    if step == BAD_STEP and KIND == "inside":
        if bad_now:
            mark(trace_dir, "fault_at.json")
            mark(trace_dir, "ready")  # the driver freezes this process inside the all_reduce below
        else:
            time.sleep(2.0)  # the bad rank is first into the collective
    if step == BAD_STEP and KIND.startswith("desync_"):
        if bad_now:
            mark(trace_dir, "fault_at.json")
        extra = {
            "desync_shape": (torch.zeros(4, 3) if bad_now else torch.zeros(3, 4)),
            "desync_dtype": torch.zeros(12, dtype=torch.float64 if bad_now else torch.float32),
            "desync_size": torch.zeros(13 if bad_now else 12),
        }.get(KIND)
        if KIND == "desync_op" and bad_now:
            dist.all_gather([torch.empty(12) for _ in range(dist.get_world_size())], torch.zeros(12))
        elif KIND == "desync_op":
            dist.all_reduce(torch.zeros(12))
        else:
            dist.all_reduce(extra)
    if KIND == "cross_group" and step == BAD_STEP and side_groups is not None:
        first, second = side_groups
        if rank == BAD_RANK:
            mark(trace_dir, "fault_at.json")
            dist.barrier(group=first)
            dist.barrier(group=second)
        elif rank == partner_of(BAD_RANK):
            dist.barrier(group=second)
            dist.barrier(group=first)
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()


def partner_of(rank: int) -> int:
    return (rank + 1) % int(os.environ["WORLD_SIZE"])


def build_model(world_size: int):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    if MODEL == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if MODEL == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    trace_dir = Path(sys.argv[1])
    torch.manual_seed(0)  # the same weights on every rank, as DDP would broadcast them
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    side_groups = None
    if KIND == "cross_group":  # every rank must create every group, in the same order
        pair = sorted({BAD_RANK, partner_of(BAD_RANK)})
        side_groups = (dist.new_group(pair), dist.new_group(pair))
    diag.init(trace_dir, telemetry=False, hang_threshold_s=HANG_THRESHOLD_S, heartbeat_interval_s=0.5)
    model = build_model(world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    leaked: list = []
    torch.manual_seed(1 + rank)
    for step, batch in enumerate(diag.wrap_loader(Batches(rank, trace_dir))):
        with diag.step():
            with diag.phase("forward"):
                time.sleep(COMPUTE_S)
                forward_fault(rank, step, trace_dir, leaked)
                loss = model(batch).pow(2).mean()
            loss.backward()
            if MODEL == "manual":
                with diag.phase("grad_sync"):
                    sync_gradients(model, rank, step, trace_dir, side_groups)
            optimizer.step()
            optimizer.zero_grad()
            if KIND == "preempted" and step >= BAD_STEP:
                if step == BAD_STEP and rank == BAD_RANK:
                    mark(trace_dir, "ready")
                time.sleep(0.2)  # still training, healthy, when the SIGTERM comes
            if KIND == "barrier_hang" and step == BAD_STEP:
                if rank == BAD_RANK:
                    mark(trace_dir, "fault_at.json")
                    while True:  # a rank stuck in its own code before the barrier
                        time.sleep(0.05)
                dist.barrier()
    diag.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
