"""Clock offset accuracy and cost at init: diag's store round trips against a barrier + all-gather.

All ranks run on this machine, so every true offset is 0 and whatever a method reports is its error. Each
rank claims a host of its own (``--hosts-per-rank``, the worst case: every rank but rank 0 measures), or the
real host name (then diag skips the measurement: offsets are exactly 0). The two methods alternate in the
same processes for ``--repeat`` rounds; medians over rounds are printed.

    python benchmarks/bench_clock_sync.py --ranks 8 --repeat 20 [--own-host] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from record import Table, add_json_option  # benchmarks/, the script's own folder

from diag.capture.clock import synchronise_clocks
from diag.launch import free_port


def barrier_all_gather(rounds: int = 5) -> tuple[float, float]:
    """The method diag used before: leave a barrier, read the clock, all-gather; median and half-spread."""
    rank, world = dist.get_rank(), dist.get_world_size()
    offsets = []
    for _ in range(rounds):
        dist.barrier()
        mine = torch.tensor([time.time_ns() // 1000], dtype=torch.int64)
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        offsets.append(gathered[rank].item() - gathered[0].item())
    return float(statistics.median(offsets)), (max(offsets) - min(offsets)) / 2


def store_round_trips(own_host: bool) -> tuple[float, float]:
    rank = dist.get_rank()
    host = socket.gethostname() if own_host else f"host{rank}"
    sync = synchronise_clocks(dist.distributed_c10d._get_default_store(), rank, dist.get_world_size(), host)
    return sync.offset_us, sync.error_us


def run_rank(rank: int, world: int, port: int, repeat: int, own_host: bool, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for _ in range(repeat):
        for name, method in (("barrier + all_gather", barrier_all_gather), ("diag store round trips", None)):
            dist.barrier()
            started = time.perf_counter()
            offset_us, error_us = method() if method else store_round_trips(own_host)
            rows.append((name, rank, offset_us, error_us, time.perf_counter() - started))
    dist.barrier()
    results.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--own-host", action="store_true", help="ranks report the real host name")
    add_json_option(parser)
    args = parser.parse_args()
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=run_rank, args=(r, args.ranks, port, args.repeat, args.own_host, results))
        for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    rows = [row for _ in procs for row in results.get(timeout=600)]
    for p in procs:
        p.join()

    columns = ["method", "ranks as", "|offset| p50", "|offset| max", "stated error p50", "time on rank 0, p50"]
    table = Table("clock_sync_own_host" if args.own_host else "clock_sync", columns)
    table.note(
        f"{args.ranks} ranks on one machine (true offsets 0), {args.repeat} rounds, "
        f"{'real host name' if args.own_host else 'one host per rank'}; medians over ranks 1-{args.ranks - 1} "
        f"and rounds; load average {os.getloadavg()[0]:.1f} at the end"
    )
    ranks_as = "one host" if args.own_host else f"{args.ranks} hosts"
    for name in ("barrier + all_gather", "diag store round trips"):
        mine = [r for r in rows if r[0] == name and r[1] != 0]
        offsets = [abs(r[2]) for r in mine]
        errors = [r[3] for r in mine]
        times = [r[4] for r in rows if r[0] == name and r[1] == 0]
        table.add(
            name, ranks_as, f"{statistics.median(offsets):,.0f} us", f"{max(offsets):,.0f} us",
            f"{statistics.median(errors):,.0f} us", f"{statistics.median(times) * 1e3:.2f} ms",
        )  # fmt: skip
    within = sum(abs(r[2]) <= r[3] + 1 for r in rows if r[0] == "diag store round trips" and r[1] != 0)
    total = sum(1 for r in rows if r[0] == "diag store round trips" and r[1] != 0)
    table.note(f"diag: true offset (0) within the stated error in {within} of {total} measurements")
    table.save(args.json)


if __name__ == "__main__":
    main()
