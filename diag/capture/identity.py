"""Who this process is in the job: from torch.distributed when it is initialised, else from the launcher's
environment (torchrun, Slurm, MPI), else a single-process job."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

# (global rank, local rank, world size, local world size) variables of each launcher, most specific first
_LAUNCHER_ENV = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
}


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    host: str
    pid: int
    launcher: str  # torchrun, slurm, mpi, pmi or none


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    # SLURM_NTASKS_PER_NODE may read "4(x2)"
    digits = value.split("(")[0].split(",")[0]
    return int(digits) if digits.isdigit() else None


def detect_identity() -> RankIdentity:
    host, pid = socket.gethostname(), os.getpid()
    launcher, env = "none", (None, None, None, None)
    for name, keys in _LAUNCHER_ENV.items():
        values = tuple(_int_env(k) for k in keys)
        if values[0] is not None and values[2] is not None:
            launcher, env = name, values
            break
    rank, local_rank, world_size, local_world_size = env
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken torch.distributed must not stop capture
        pass
    rank = rank or 0
    world_size = world_size or 1
    return RankIdentity(
        rank=rank,
        local_rank=local_rank if local_rank is not None else rank,
        world_size=world_size,
        local_world_size=local_world_size or world_size,
        host=host,
        pid=pid,
        launcher=launcher,
    )
