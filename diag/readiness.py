"""Does this job's environment let a hang be diagnosed? The settings that decide what is left to read when a
collective never returns: PyTorch's Flight Recorder and its dump, the NCCL watchdog, NCCL's own log, the
process-group timeout against the step time, and where the dumps and diag's traces land.

``check`` reads an environment (the process's, or the one a job recorded in its manifest) and returns one
``Check`` per setting: ``ok``, ``change`` (diagnosis will miss something: the setting to use and why) or
``note`` (worth knowing, not wrong). ``diag doctor`` prints them; ``diag.init`` says in one line on rank 0
when something should change. Pure Python, no torch: it runs wherever diag is installed.

The defaults are PyTorch's (c10d's ProcessGroupNCCL and its Flight Recorder) in recent releases."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

# What a job's manifest records (``hang_settings``), so that ``diag doctor TRACE_DIR`` judges the job's own
HANG_SETTINGS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",  # Flight Recorder's former name
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "TORCH_INCLUDE_STACK_TRACE",
    "TORCH_NCCL_ENABLE_TIMING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
)
FR_BUFFER_ENTRIES = 2000  # what to set: a few minutes of collectives for most jobs, ~1 MB of host memory
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"  # TORCH_FR_DUMP_TEMP_FILE's default: each node's own /tmp
DEFAULT_HEARTBEAT_TIMEOUT_S = 480
MIN_HEARTBEAT_TIMEOUT_S = 60  # below this the monitor may kill a rank still writing its dump
TIMEOUT_STEPS_MIN = 5  # a timeout under 5 steps' time: one slow step (a checkpoint, a data stall) kills the job
TIMEOUT_LONG_S = 1800  # past 30 min a hang burns that long on every GPU before anything says so
# Filesystems that every node of a job can see (from /proc/mounts)
SHARED_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs", "wekafs"}
    | {"fuse.gcsfuse", "fuse.s3fs", "fuse.mountpoint-s3", "fuse.juicefs", "virtiofs", "9p", "cifs", "smb3"}
)
STATUSES = ("ok", "note", "change")
TRUE_VALUES = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | note | change
    now: str  # what the setting is now
    advice: str  # the setting to use (empty when ok)
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobFacts:
    """What is known of the job beside its environment (None: not known)."""

    backend: str | None = None  # "nccl", "gloo", "cpu:gloo,cuda:nccl"
    world_size: int | None = None
    local_world_size: int | None = None
    trace_dir: str | None = None
    timeouts_s: Mapping[str, float] | None = None  # process group -> its collective timeout
    median_step_s: float | None = None

    @property
    def multi_node(self) -> bool | None:
        if self.world_size is None or self.local_world_size is None:
            return None
        return self.world_size > self.local_world_size

    @property
    def uses_nccl(self) -> bool | None:
        return None if self.backend is None else "nccl" in self.backend


def check(environ: Mapping[str, str], job: JobFacts | None = None, mounts: list[tuple[str, str]] | None = None):
    """Every check, in the order a hang needs them: record, dump, detect, locate."""
    job = job or JobFacts()
    mounts = read_mounts() if mounts is None else mounts
    checks = [_flight_recorder(environ), _dump_file(environ, job, mounts)]
    if job.uses_nccl is not False:  # NCCL's watchdog and log: not there in a gloo-only job
        checks += [
            _dump_on_timeout(environ),
            _async_error_handling(environ),
            _monitoring(environ),
            _nccl_log(environ),
            _timing_serialises(environ),
        ]
    checks.append(_stack_traces(environ))
    checks.append(_timeout(job))
    if job.trace_dir is not None:
        checks.append(_trace_dir(job, mounts))
    return [c for c in checks if c is not None]


def worst(checks) -> str:
    return max((c.status for c in checks), key=STATUSES.index, default="ok")


# -- the checks ---------------------------------------------------------------------------------------------


def _flight_recorder(environ) -> Check:
    name = "flight recorder"
    size, variable = _int(environ, "TORCH_FR_BUFFER_SIZE"), "TORCH_FR_BUFFER_SIZE"
    if size is None:
        size, variable = _int(environ, "TORCH_NCCL_TRACE_BUFFER_SIZE"), "TORCH_NCCL_TRACE_BUFFER_SIZE"
    if not size or size <= 0:
        return Check(
            name,
            "change",
            _shown(environ, "TORCH_FR_BUFFER_SIZE", "unset: off"),
            f"TORCH_FR_BUFFER_SIZE={FR_BUFFER_ENTRIES}",
            "Flight Recorder keeps each rank's last collectives (op, sizes, state, seq) in a ring buffer and "
            "dumps them when a collective times out: without it a hang leaves nothing saying which collective "
            "each rank was in, and diag cannot see collectives issued from C++ (DDP buckets, DTensor)",
        )
    if variable == "TORCH_NCCL_TRACE_BUFFER_SIZE":
        return Check(
            name,
            "note",
            f"TORCH_NCCL_TRACE_BUFFER_SIZE={size}",
            f"TORCH_FR_BUFFER_SIZE={size}",
            "on, under its former name: newer PyTorch reads TORCH_FR_BUFFER_SIZE",
        )
    return Check(name, "ok", f"{variable}={size}", "", "on: each rank keeps its last collectives")


def _dump_file(environ, job: JobFacts, mounts) -> Check:
    name = "dump location"
    prefix = environ.get("TORCH_FR_DUMP_TEMP_FILE") or DEFAULT_DUMP_PREFIX
    now = f"TORCH_FR_DUMP_TEMP_FILE={prefix}" + ("" if environ.get("TORCH_FR_DUMP_TEMP_FILE") else " (default)")
    folder = os.path.dirname(prefix) or "."
    if not _writable(folder):
        return Check(
            name,
            "change",
            now,
            "TORCH_FR_DUMP_TEMP_FILE=<a writable, shared directory>/nccl_trace_rank_",
            f"{folder} does not exist or is not writable here: every rank's dump would be lost",
        )
    shared = is_shared(folder, mounts)
    if job.multi_node and not shared:
        return Check(
            name,
            "change",
            now,
            "TORCH_FR_DUMP_TEMP_FILE=<a shared directory>/nccl_trace_rank_",
            f"{folder} is on each node's own disk ({_fs_type(folder, mounts) or 'a local filesystem'}): the dumps "
            "of a multi-node job end up on every node, and a node that is replaced takes its ranks' with it",
        )
    where = "a shared filesystem" if shared else "this node's disk"
    return Check(name, "ok", now, "", f"writable, on {where}")


def _dump_on_timeout(environ) -> Check:
    name = "dump on timeout"
    value = environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT")
    if _switched_off(value):
        return Check(
            name,
            "change",
            f"TORCH_NCCL_DUMP_ON_TIMEOUT={value}",
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
            "the watchdog writes no Flight Recorder dump when a collective times out: the buffer dies with the rank",
        )
    if value is None:
        return Check(
            name,
            "note",
            "unset",
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
            "recent PyTorch dumps on a timeout by default, older releases do not: set it to be sure",
        )
    return Check(name, "ok", f"TORCH_NCCL_DUMP_ON_TIMEOUT={value}", "", "the watchdog dumps on a timeout")


def _async_error_handling(environ) -> Check | None:
    name = "async error handling"
    value = environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if value is None:
        return None  # the default (3: tear down without cleaning up) keeps the dump
    if value.strip() == "1":
        return Check(
            name,
            "change",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
            "1 aborts the communicators and kills the process on the first error, which can end a rank before "
            "its Flight Recorder dump is written; 3 (the default) tears down without that cleanup",
        )
    return Check(name, "ok", f"TORCH_NCCL_ASYNC_ERROR_HANDLING={value}", "", "errors are handled; the dump is kept")


def _monitoring(environ) -> Check:
    name = "watchdog monitor"
    enabled = environ.get("TORCH_NCCL_ENABLE_MONITORING")
    if _switched_off(enabled):
        return Check(
            name,
            "note",
            f"TORCH_NCCL_ENABLE_MONITORING={enabled}",
            "TORCH_NCCL_ENABLE_MONITORING=1",
            "nothing kills a rank whose watchdog itself is stuck (in a CUDA call, in a dump): the job can hang "
            "with no timeout ever firing; diag's own stall dump still fires",
        )
    timeout_s = _int(environ, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    if timeout_s is not None and timeout_s < MIN_HEARTBEAT_TIMEOUT_S:
        return Check(
            name,
            "change",
            f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={timeout_s}",
            f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={DEFAULT_HEARTBEAT_TIMEOUT_S}",
            f"under {MIN_HEARTBEAT_TIMEOUT_S} s the monitor may kill a rank while it is still writing its dump",
        )
    shown = f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={timeout_s}" if timeout_s is not None else "defaults"
    return Check(name, "ok", shown, "", "a stuck watchdog is killed after its heartbeat timeout")


def _nccl_log(environ) -> Check:
    name = "NCCL log"
    level = environ.get("NCCL_DEBUG")
    if level is None:
        return Check(
            name,
            "ok",
            "unset",
            "",
            "diag.init has NCCL write its init and topology log into each rank's trace directory",
        )
    if level.strip().upper() == "TRACE":
        return Check(
            name,
            "change",
            "NCCL_DEBUG=TRACE",
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH",
            "TRACE logs every call: it slows every collective and fills the disk",
        )
    if not environ.get("NCCL_DEBUG_FILE"):
        return Check(
            name,
            "note",
            f"NCCL_DEBUG={level}",
            "NCCL_DEBUG_FILE=<shared directory>/nccl.%h.%p",
            "without a file NCCL's lines of every rank interleave in the job's output, and diag cannot read them",
        )
    return Check(name, "ok", f"NCCL_DEBUG={level} NCCL_DEBUG_FILE={environ['NCCL_DEBUG_FILE']}", "", "logged to a file")


def _timing_serialises(environ) -> Check | None:
    timing = (environ.get("TORCH_NCCL_ENABLE_TIMING") or "").strip().lower() in TRUE_VALUES
    if not timing:
        return None
    if (environ.get("CUDA_DEVICE_MAX_CONNECTIONS") or "").strip() == "1":
        return Check(
            "collective timing",
            "change",
            "TORCH_NCCL_ENABLE_TIMING=1 with CUDA_DEVICE_MAX_CONNECTIONS=1",
            "unset TORCH_NCCL_ENABLE_TIMING (diag times collectives itself)",
            "with one hardware queue the timing events serialise communication with compute (pytorch#143890): "
            "the job runs slower than without them",
        )
    return Check("collective timing", "ok", "TORCH_NCCL_ENABLE_TIMING=1", "", "collectives timed by NCCL's watchdog")


def _stack_traces(environ) -> Check:
    value = environ.get("TORCH_INCLUDE_STACK_TRACE")
    if _switched_off(value):
        return Check(
            "stacks in the dump",
            "ok",
            f"TORCH_INCLUDE_STACK_TRACE={value}",
            "",
            "the dump carries no Python stacks (diag's stall dump records each rank's)",
        )
    return Check(
        "stacks in the dump",
        "note",
        "on (default)",
        "TORCH_INCLUDE_STACK_TRACE=0 if dumps do not arrive",
        "the dump collects each rank's Python stack under the GIL: a rank whose Python thread holds it can make "
        "the dump itself hang; diag's stall dump records the stacks from its own thread either way",
    )


def _timeout(job: JobFacts) -> Check | None:
    if not job.timeouts_s:
        return None
    shortest_s, longest_s = min(job.timeouts_s.values()), max(job.timeouts_s.values())
    now = f"{shortest_s:.0f} s" if shortest_s == longest_s else f"{shortest_s:.0f}-{longest_s:.0f} s"
    step_s = job.median_step_s
    if step_s and shortest_s < TIMEOUT_STEPS_MIN * step_s:
        return Check(
            "collective timeout",
            "change",
            now,
            f"timeout >= {TIMEOUT_STEPS_MIN * step_s:.0f} s (init_process_group(timeout=...))",
            f"under {TIMEOUT_STEPS_MIN} steps of {step_s:.1f} s: one slow step (a checkpoint, a data stall) "
            "ends the job as if it hung",
        )
    if longest_s > TIMEOUT_LONG_S:
        return Check(
            "collective timeout",
            "note",
            now,
            "diag.init(hang_threshold_s=...) finds a hang sooner; triage --watch reads it live",
            f"a hang holds every GPU {longest_s / 60:.0f} min before the timeout fires",
        )
    return Check("collective timeout", "ok", now, "", "long enough for a slow step, short enough for a hang")


def _trace_dir(job: JobFacts, mounts) -> Check:
    shared = is_shared(job.trace_dir, mounts)
    if job.multi_node and not shared:
        return Check(
            "trace directory",
            "change",
            job.trace_dir,
            "diag.init(<a directory on a shared filesystem>)",
            f"on each node's own disk ({_fs_type(job.trace_dir, mounts) or 'local'}): diag triage needs every "
            "rank's directory in one place",
        )
    return Check("trace directory", "ok", job.trace_dir, "", "shared" if shared else "on this node (one node)")


# -- helpers --------------------------------------------------------------------------------------------------


def _switched_off(value: str | None) -> bool:
    """A boolean variable set to anything but a true value (torch's getCvarBool reads it so)."""
    return value is not None and value.strip().lower() not in TRUE_VALUES


def _int(environ, name: str) -> int | None:
    try:
        return int(environ[name].strip())
    except (KeyError, ValueError, AttributeError):
        return None


def _shown(environ, name: str, unset: str) -> str:
    return f"{name}={environ[name]}" if name in environ else unset


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)


def read_mounts(path: str = "/proc/mounts") -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount; empty where the system has no /proc/mounts."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:
            mounts.append((fields[1].replace("\\040", " "), fields[2]))
    return mounts


def _fs_type(folder: str, mounts) -> str | None:
    """The filesystem type of the mount holding ``folder``: the longest mount point that contains it."""
    resolved = os.path.realpath(folder)
    best, best_type = "", None
    for point, fs_type in mounts:
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fs_type
    return best_type


def is_shared(folder: str, mounts) -> bool:
    return _fs_type(folder, mounts) in SHARED_FILESYSTEMS
