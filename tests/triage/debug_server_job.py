"""A real gloo job run with PyTorch's debug server dumping every rank's stacks and Flight Recorder periodically.

Run one process per rank: ``python debug_server_job.py DUMP_DIR FRONTEND_PORT`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (``diag.launch.start_ranks`` sets them) and TORCH_FR_BUFFER_SIZE set (or Flight
Recorder records nothing). Every rank starts the debug server's worker; rank 0 also starts its frontend, in a
spawned process that writes ``stacks_<time>.txt`` and ``fr_trace_<time>.txt`` into DUMP_DIR every
DUMP_INTERVAL_S, and writes that process's pid to ``DUMP_DIR/../frontend.pid`` so that whoever ends the job can
end it too (it is a daemon of rank 0, but a killed rank 0 takes none of its children with it). Each rank's
output goes to ``DUMP_DIR/../rank<N>.log``.

World 3: STEPS_BEFORE_STALL healthy steps of one all_reduce, then rank 2 stalls in ``wait_for_slow_input``
(a sleep) before its all_reduce, which ranks 0 and 1 wait in (the group's timeout is long: they keep waiting).
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server

DUMP_INTERVAL_S = 1.0
FETCH_TIMEOUT_S = 3.0  # a rank that does not answer within this is "PARTIAL DATA" in that round's dumps
STEPS_BEFORE_STALL = 3
STALL_S = 3600


def wait_for_slow_input() -> None:
    """Where rank 2 stalls: its stack in the debug server's dump must name this function."""
    time.sleep(STALL_S)


def train(rank: int) -> None:
    grad = torch.ones(64) * rank
    for step in range(STEPS_BEFORE_STALL + 1):
        if rank == 2 and step == STEPS_BEFORE_STALL:
            wait_for_slow_input()
        dist.all_reduce(grad)


def main() -> None:
    dump_dir, frontend_port = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # the frontend logs a traceback each round it cannot render fr_trace (gloo): to a file, not the launcher's
    # pipe, which it would fill and block on, and which it would hold open after rank 0 ends
    log = open(os.path.join(os.path.dirname(os.path.abspath(dump_dir)), f"rank{rank}.log"), "w")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    # the frontend reads the workers' addresses from the job's store, so the group (and its store) comes first
    start_debug_server(
        port=frontend_port,
        start_method="spawn",
        dump_dir=dump_dir,
        dump_interval=DUMP_INTERVAL_S,
        fetch_timeout=FETCH_TIMEOUT_S,
    )
    if rank == 0:
        from torch.distributed import debug

        pid_file = os.path.join(os.path.dirname(os.path.abspath(dump_dir)), "frontend.pid")
        with open(pid_file, "w") as f:
            f.write(str(debug._DEBUG_SERVER_PROC.pid))
    train(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
