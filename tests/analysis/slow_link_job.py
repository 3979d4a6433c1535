"""A small gloo job with several process groups, one rank's collectives slowed down: the slow-link test's run.

usage: slow_link_job.py TRACE_DIR STEPS SLOW_RANK DELAY_MS

Every pair of ranks gets its own group (``dist.new_group``); each step every rank all-reduces 1 MiB in each of
its groups, all ranks going through the groups in the same order. On SLOW_RANK every all_reduce takes DELAY_MS
longer *inside* the call, before the data moves: every member of the group waits for it inside the collective,
as behind a slow NIC or link, and the collective's transfer time (its shortest duration over the group) grows.
(A delay before the call would make the rank late instead, a straggler, which transfer times leave out.)
"""

from __future__ import annotations

import datetime
import functools
import itertools
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import diag


def slow_down_all_reduce(delay_ms: float) -> None:
    """Before diag.init, so diag's wrapper times the delayed call (it wraps what c10d.all_reduce is then)."""
    original = c10d.all_reduce

    @functools.wraps(original)
    def all_reduce(*args, **kwargs):
        time.sleep(delay_ms / 1e3)
        return original(*args, **kwargs)

    c10d.all_reduce = all_reduce
    dist.all_reduce = all_reduce


def main(trace_dir: str, steps: int, slow_rank: int, delay_ms: float) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = list(itertools.combinations(range(world), 2))
    groups = {pair: dist.new_group(list(pair)) for pair in pairs}  # every rank creates every group, in order
    if rank == slow_rank:
        slow_down_all_reduce(delay_ms)
    diag.init(trace_dir, telemetry=False, hang_threshold_s=300)
    tensor = torch.ones(256 * 1024)  # 1 MiB
    for _ in range(steps):
        with diag.step():
            for pair in pairs:
                if rank in pair:
                    dist.all_reduce(tensor, group=groups[pair])
    diag.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
