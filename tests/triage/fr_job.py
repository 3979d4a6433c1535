"""A real gloo job that writes each rank's Flight Recorder dump, for the Flight Recorder verdict cases.

Run one process per rank: ``python fr_job.py SCENARIO OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (``diag.launch.start_ranks`` sets them). Each rank writes
``OUT_DIR/fr_rank_<rank>`` (torch's own pickle from ``_dump_fr_trace``, the recorder gloo writes to) when the job
ends, or DUMP_AFTER_S after start while it hangs (as a watchdog's dump on timeout would), then exits.
Needs TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) set, or nothing is recorded.

Scenarios:
  missing_rank   world 3: rank 2 stalls in step 3 before its all_reduce (three async all_reduces a step,
                 as DDP's buckets issue them); ranks 0 and 1 wait in it.
  subgroup_chain world 3, sub-group [1, 2]: rank 2 stalls in step 3 before the sub-group's all_reduce; rank 1
                 waits for it there, rank 0 waits for both in the world group's all_reduce.
  rooted         world 3, healthy: gather, scatter and all_to_all_single with uneven splits, three steps.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

DUMP_AFTER_S = 8.0  # after init: the steps before the stall take well under a second
STEPS = 5
STALL_STEP = 3


def _dump(out_dir: str, rank: int) -> None:
    data = torch._C._distributed_c10d._dump_fr_trace()
    path = os.path.join(out_dir, f"fr_rank_{rank}")
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _dump_later(out_dir: str, rank: int, world: int) -> None:
    """Every rank dumps at the same time into the hang, then leaves once all have: a rank that left earlier
    would close its connections and turn the others' wait into an error."""

    def fire():
        time.sleep(DUMP_AFTER_S)
        _dump(out_dir, rank)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out_dir, f"fr_rank_{r}")) for r in range(world)
        ):
            time.sleep(0.1)
        os._exit(0)

    threading.Thread(target=fire, daemon=True).start()


def missing_rank(rank: int, world: int) -> None:
    grads = [torch.ones(64) * rank for _ in range(3)]
    for step in range(STEPS):
        if rank == 2 and step == STALL_STEP:
            time.sleep(3600)
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for work in works:
            work.wait()


def subgroup_chain(rank: int, world: int) -> None:
    sub = dist.new_group([1, 2])
    t = torch.ones(16)
    for step in range(STEPS):
        if rank in (1, 2):
            if rank == 2 and step == STALL_STEP:
                time.sleep(3600)
            dist.all_reduce(t, group=sub)
        dist.all_reduce(t)


def rooted(rank: int, world: int) -> None:
    for _ in range(3):
        chunks = [torch.zeros(4) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.ones(4) * rank, chunks, dst=0)
        parts = [torch.full((3,), float(r)) for r in range(world)] if rank == 0 else None
        dist.scatter(torch.zeros(3), parts, src=0)
        sends = [peer + 1 for peer in range(world)]  # rank r sends peer+1 rows to each peer
        receives = [rank + 1] * world
        out = torch.zeros(sum(receives), 2)
        dist.all_to_all_single(out, torch.ones(sum(sends), 2), receives, sends)
    dist.barrier()


SCENARIOS = {"missing_rank": missing_rank, "subgroup_chain": subgroup_chain, "rooted": rooted}


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    if scenario != "rooted":
        _dump_later(out_dir, rank, world)
    SCENARIOS[scenario](rank, world)
    _dump(out_dir, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
