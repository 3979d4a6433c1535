"""NCCL's own log, written per rank into the trace (``<rank dir>/nccl.log``) where the user has not set it up.

NCCL reads ``NCCL_DEBUG``, ``NCCL_DEBUG_SUBSYS`` and ``NCCL_DEBUG_FILE`` once, when the process creates its first
communicator. torch creates NCCL communicators lazily, at a group's first collective (or at
``init_process_group(device_id=...)``), so at ``diag.init`` (after ``init_process_group``) the variables usually
still take effect. diag sets them only when the user set none of the three: what the user set is never changed.
When NCCL has already started in this process, it is too late: said once, and recorded in the manifest.

The subsystems are the ones NCCL logs while it sets communicators up, not per collective: INIT (version,
network, rings, trees, connections with their transport, channel counts), ENV (the NCCL_* settings in effect),
GRAPH (the topology search) and NET (the NICs and GPUDirect RDMA). A few hundred lines per communicator.
``diag.trace.nccl_log`` parses the file; nothing of it is ever executed.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

from diag._warn import warn_once
from diag.trace.schema import NCCL_LOG_FILE

NCCL_LOG_VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
NCCL_LOG_SUBSYS = "INIT,ENV,GRAPH,NET"
_set_by_diag: dict[str, str] = {}  # what diag set in this process: a second diag.init must not take it for the user's


def nccl_log_path(rank_dir: Path) -> str:
    """The NCCL_DEBUG_FILE value for ``rank_dir``: absolute (the job may change directory), with '%' doubled
    (NCCL expands %h and %p in it; '%%' is a literal '%')."""
    return str((rank_dir / NCCL_LOG_FILE).absolute()).replace("%", "%%")


def configure_nccl_log(
    rank_dir: Path,
    nccl_available: bool,
    nccl_started: list[str],
    environ: MutableMapping[str, str] | None = None,
) -> str:
    """Set the three variables in ``environ`` (the process environment) when the user set none of them and
    NCCL has not started; the status for the manifest's ``capture`` either way.

    ``nccl_started``: the NCCL process groups that already have a communicator (``nccl_groups_started``)."""
    environ = os.environ if environ is None else environ
    user = [name for name in NCCL_LOG_VARIABLES if name in environ]
    if user and {name: environ.get(name) for name in NCCL_LOG_VARIABLES} == _set_by_diag:
        return f"off: set by an earlier diag.init of this process; NCCL writes to {environ['NCCL_DEBUG_FILE']}"
    if user:
        shown = ", ".join(f"{name}={environ[name]}" for name in user)
        return f"off: the user set {shown}; left as set"
    if not nccl_available:
        return "off: this torch has no NCCL"
    if nccl_started:
        message = (
            f"NCCL already started in this process (process groups {', '.join(nccl_started[:4])}): too late to "
            f"capture its log into {NCCL_LOG_FILE}; call diag.init before the first NCCL collective, or set "
            f"NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS={NCCL_LOG_SUBSYS} NCCL_DEBUG_FILE=<path> yourself"
        )
        warn_once("nccl-log-late", message)
        return f"off: too late, NCCL already started (process groups {', '.join(nccl_started[:4])})"
    values = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": NCCL_LOG_SUBSYS, "NCCL_DEBUG_FILE": nccl_log_path(rank_dir)}
    environ.update(values)
    _set_by_diag.clear()
    _set_by_diag.update(values)
    return (
        f"on: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS={NCCL_LOG_SUBSYS} into {NCCL_LOG_FILE} (from NCCL's first communicator)"
    )


def start_nccl_log(rank_dir: Path) -> str:
    """``configure_nccl_log`` for this process: whether torch has NCCL and which NCCL groups have started, asked
    of torch. Never raises: a failure is the status."""
    try:
        import torch.distributed as dist

        from diag.capture import torch_private

        available = dist.is_available() and dist.is_nccl_available()
        started = torch_private.nccl_groups_started() if available and dist.is_initialized() else []
        return configure_nccl_log(rank_dir, available, started)
    except Exception as exc:
        warn_once("nccl-log", f"cannot set up NCCL's log ({exc!r}); the report has no NCCL view")
        return f"off: {exc!r}"
