"""A small data-parallel CPU job over gloo that goes wrong in one chosen way, for ``diag triage`` tests.

Run one process per rank (``run_job`` in conftest.py does): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set,
``python hang_job.py SCENARIO TRACE_DIR``. Scenarios:
  healthy   every rank trains STEPS steps and finishes
  skip      rank 1 skips the gradient all_reduces of step 3, trains on, and finishes one step "early":
            the others wait in their last all_reduce for a rank that never comes
  loader    rank 1's data loader blocks forever before step 3
  desync    at step 3 rank 1 calls all_gather where the others call all_reduce
  wide      at step 3 rank 1 all-reduces its gradients in float64, the others in float32: gloo aborts the
            ranks that receive more bytes than they expect (the others)
  narrow    the same in float16: gloo aborts rank 1 itself
  kill      rank 1 sleeps in step 3 (the test SIGKILLs it there)
  chain     rank 2's data loader blocks before step 3; rank 1 first waits for rank 2 in a barrier of a side
            group [1, 2]; rank 0 waits in the all_reduce for both: the culprit is rank 2, at the end of the chain
  slow      rank 1's forward takes 3 s in step 3 (longer than the hang threshold, shorter than the timeout)
  regroup   after step 0 every rank destroys its process groups and initialises the default group again (on
            HANG_JOB_SECOND_PORT: the launcher's store holds the first group's keys), as an elastic job does;
            the new default group's numbering starts again and diag names it "0@1", Flight Recorder "0".
            In step 4 rank 1 blocks in its data loader: the others wait in the new group's all_reduce
  reinit    as regroup, but rank 0's re-initialisation raises (another process holds the new group's port) and
            ends it; the others wait for its store outside any collective until they time out or are stopped
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import diag

STEPS = 6
BAD_STEP = 3
REGROUP_AFTER_STEP = 0  # the regroup scenario's groups are made again after this step
REGROUP_BAD_STEP = 4  # later than BAD_STEP: the new group's seqs run past the old one's
BAD_RANK = 1
CHAIN_END_RANK = 2
PG_TIMEOUT_S = float(os.environ.get("HANG_JOB_PG_TIMEOUT_S", "8"))
SLOW_STEP_S = 3.0
HANG_THRESHOLD_S = float(os.environ.get("HANG_JOB_THRESHOLD_S", "2"))
HEARTBEAT_S = float(os.environ.get("HANG_JOB_HEARTBEAT_S", "0.5"))
DTYPE_SCENARIOS = {"wide": torch.float64, "narrow": torch.float16}


class Batches:
    """Random batches; on the bad rank in the loader scenario, blocks forever like a stuck worker."""

    def __init__(self, rank: int, scenario: str):
        self.rank, self.scenario = rank, scenario

    def __iter__(self):
        for step in range(STEPS):
            stuck_rank = {"loader": BAD_RANK, "chain": CHAIN_END_RANK, "regroup": BAD_RANK}.get(self.scenario)
            if self.rank == stuck_rank and step == (REGROUP_BAD_STEP if self.scenario == "regroup" else BAD_STEP):
                threading.Event().wait()  # a data loader worker that never answers
            yield torch.randn(8, 64)


def sync_gradients(model, rank: int, step: int, scenario: str, side_group=None) -> None:
    if scenario == "chain" and rank == BAD_RANK and step == BAD_STEP:
        dist.barrier(group=side_group)  # waits for rank 2, which is stuck in its data loader
    if scenario == "skip" and rank == BAD_RANK and step == BAD_STEP:
        return  # the bug: this rank skips its gradient sync in one step
    for param in model.parameters():
        if scenario == "desync" and rank == BAD_RANK and step == BAD_STEP and param.dim() == 2:
            gathered = [torch.empty_like(param.grad) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, param.grad)  # the bug: the wrong collective
            continue
        if scenario in DTYPE_SCENARIOS and rank == BAD_RANK and step == BAD_STEP:
            dist.all_reduce(param.grad.to(DTYPE_SCENARIOS[scenario]))  # the bug: another dtype on one rank
            continue
        dist.all_reduce(param.grad)
    if scenario == "kill" and rank == BAD_RANK and step == BAD_STEP:
        (Path(sys.argv[2]) / "ready_to_kill").write_text(str(os.getpid()))
        time.sleep(3600)


def regroup(scenario: str) -> None:
    """End every process group and make the default group again, as an elastic job's re-initialisation does."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if scenario == "reinit" and rank == 0:  # the store's port taken: its server cannot bind
        taken = socket.socket()
        taken.bind(("", int(os.environ["HANG_JOB_SECOND_PORT"])))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{address}:{os.environ['HANG_JOB_SECOND_PORT']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
    )


def main() -> None:
    scenario, trace_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    rank = dist.get_rank()
    side_group = dist.new_group([1, 2]) if scenario == "chain" else None  # every rank must create it
    diag.init(trace_dir, telemetry=False, hang_threshold_s=HANG_THRESHOLD_S, heartbeat_interval_s=HEARTBEAT_S)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    steps = STEPS - 1 if scenario == "skip" and rank == BAD_RANK else STEPS
    for step, batch in enumerate(diag.wrap_loader(Batches(rank, scenario))):
        if step >= steps:
            break
        with diag.step():
            if scenario == "slow" and rank == BAD_RANK and step == BAD_STEP:
                with diag.phase("forward"):
                    time.sleep(SLOW_STEP_S)  # a slow rank, not a hung one
            model(batch).pow(2).mean().backward()
            with diag.phase("grad_sync"):
                sync_gradients(model, rank, step, scenario, side_group)
            optimizer.step()
            optimizer.zero_grad()
        if scenario in ("regroup", "reinit") and step == REGROUP_AFTER_STEP:
            regroup(scenario)
    diag.finish()
    dist.destroy_process_group()
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
