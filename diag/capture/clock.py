"""Clock anchors: each rank's wall-clock offset from rank 0, so timelines from different hosts line up.

All ranks leave a barrier at nearly the same instant (within the network latency); each reads its clock
right after and the readings are all-gathered. The median over a few rounds is the offset, the spread
its uncertainty. The same all-gather carries rank 0's run id to everyone.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockSync:
    offset_us: float
    error_us: float
    run_id: str


def synchronise_clocks(device, rounds: int = 5) -> ClockSync:
    """Collective: every rank of the default group must call it (diag.init does)."""
    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    run_token = random.getrandbits(62)
    offsets = []
    run_ids = set()
    for _ in range(rounds):
        dist.barrier()
        now_us = time.time_ns() // 1000
        mine = torch.tensor([now_us, run_token], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine)
        values = [g.tolist() for g in gathered]
        offsets.append(values[rank][0] - values[0][0])
        run_ids.add(values[0][1])
    spread = (max(offsets) - min(offsets)) / 2 if len(offsets) > 1 else 0.0
    return ClockSync(offset_us=float(statistics.median(offsets)), error_us=float(spread), run_id=f"{min(run_ids):016x}")
