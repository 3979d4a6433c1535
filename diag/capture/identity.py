"""Who this process is in the job: from torch.distributed when it is initialised, else from the launcher's
environment (torchrun, Slurm, MPI), else a single-process job. And which job it belongs to: the scheduler's
job id (Slurm, Kubernetes JobSet / Kubeflow Trainer, Kubeflow PyTorchJob) or torchelastic's run id, with the
restart count, so that every rank of one attempt shares a run id and a restart gets a new one."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

# (global rank, local rank, world size, local world size) variables of each launcher, most specific first
_LAUNCHER_ENV = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
}


@dataclass(frozen=True)
class LauncherJob:
    """The job this process belongs to, as its launcher or scheduler names it."""

    scheduler: str  # slurm, kubernetes, torchelastic
    job_id: str
    job_name: str | None = None
    restarts: dict[str, int] = field(default_factory=dict)  # {what restarted: count}, counts > 0 only
    run_id: str = ""  # job_id plus the restarts: shared by the ranks of one attempt

    def to_manifest(self) -> dict:
        return {
            "scheduler": self.scheduler,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "restarts": dict(self.restarts),
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
    job: LauncherJob | None = None


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    # SLURM_NTASKS_PER_NODE may read "4(x2)"
    digits = value.split("(")[0].split(",")[0]
    return int(digits) if digits.isdigit() else None


# restart counters of each layer: {what restarted: variable}, and the run id suffix each adds
_RESTART_ENV = {
    "slurm_requeue": "SLURM_RESTART_COUNT",
    "jobset_restart": "JOBSET_RESTART_ATTEMPT",
    "torchelastic_restart": "TORCHELASTIC_RESTART_COUNT",
}
_RESTART_SUFFIX = {"slurm_requeue": "requeue", "jobset_restart": "attempt", "torchelastic_restart": "restart"}


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _count(name: str) -> int:
    value = _env(name)
    return int(value) if value is not None and value.isdigit() else 0


def detect_job() -> LauncherJob | None:
    """The scheduler's job (outermost first: Slurm, then Kubernetes), else torchelastic's rendezvous run id.

    Restart counts of every layer are kept: a Slurm requeue, a JobSet restart and a torchelastic worker-group
    restart each start new processes in the same job, whose traces must not be mixed with the last attempt's."""
    restarts = {what: _count(variable) for what, variable in _RESTART_ENV.items()}
    restarts = {k: v for k, v in restarts.items() if v > 0}
    job = None
    if (job_id := _env("SLURM_JOB_ID")) is not None:
        job = ("slurm", job_id, _env("SLURM_JOB_NAME"))
    elif (kube := _kubernetes_job()) is not None:
        job = ("kubernetes", kube, kube)
    elif (run_id := _env("TORCHELASTIC_RUN_ID")) is not None and run_id != "none":  # torchrun's default: "none"
        job = ("torchelastic", run_id, None)
    if job is None:
        return None
    scheduler, job_id, name = job
    suffix = "".join(f"-{_RESTART_SUFFIX[k]}{v}" for k, v in restarts.items())
    return LauncherJob(scheduler, job_id, name, restarts, run_id=f"{job_id}{suffix}")


def _kubernetes_job() -> str | None:
    """The Kubernetes job of this pod: a JobSet's name (JobSet, Kubeflow Trainer's TrainJob), else a Kubeflow
    PyTorchJob's, which the training operator puts only in the rendezvous address it gives every pod
    (MASTER_ADDR ``<job>-master-0``, or PET_RDZV_ENDPOINT ``<job>-worker-0:<port>`` for elastic jobs)."""
    if _env("KUBERNETES_SERVICE_HOST") is None:
        return None
    if (name := _env("JOBSET_NAME")) is not None:
        return name
    for variable, suffix in (("MASTER_ADDR", "-master-0"), ("PET_RDZV_ENDPOINT", "-worker-0")):
        host = (_env(variable) or "").split(":")[0].split(".")[0]
        if host.endswith(suffix) and len(host) > len(suffix):
            return host[: -len(suffix)]
    return None


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
        job=detect_job(),
    )
