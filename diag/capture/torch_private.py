"""Every private torch API diag touches, in one place, with the torch versions it was checked on.

torch may rename or drop any of these in a release. Each function here either returns what diag needs or
raises, and the callers (in capture, never on a path that may raise into the training loop) turn a failure
into their usual one warning and a degraded capture. Checked on torch 2.13.0 (CPU build, gloo) and, through the
GPU artifacts in ../shared/fixtures, on the CUDA build of the same version; the oldest torch diag supports is
2.4. When torch changes one of these, this module is the only place to change.
"""

from __future__ import annotations


def process_group_names() -> dict:
    """Every process group torch knows -> its name (``distributed_c10d._world.pg_names``)."""
    import torch.distributed.distributed_c10d as c10d

    return dict(c10d._world.pg_names)


def process_groups() -> list:
    """Every process group torch knows (``distributed_c10d._world.pg_map``)."""
    import torch.distributed.distributed_c10d as c10d

    return list(c10d._world.pg_map)


def default_group():
    """The default (world) process group (``distributed_c10d._get_default_group``)."""
    from torch.distributed.distributed_c10d import _get_default_group

    return _get_default_group()


def root_mesh(mesh):
    """The DeviceMesh a sub-mesh (``mesh["tp"]``) was sliced from (``DeviceMesh._get_root_mesh``); itself when
    it is one."""
    return mesh._get_root_mesh()


def process_group_timeout_s(group) -> float | None:
    """The timeout of the group's collectives (its backend's ``options._timeout``: gloo's and NCCL's), or None."""
    import torch

    for device in ("cuda", "cpu"):
        try:
            timeout = group._get_backend(torch.device(device)).options._timeout
        except Exception:  # no backend for that device in this group
            continue
        return timeout.total_seconds()
    return None


def sequence_number(group) -> int:
    """The group's c10d sequence number: the number Flight Recorder and NCCL's watchdog report
    (``ProcessGroup._get_sequence_number_for_group``)."""
    return int(group._get_sequence_number_for_group())


def nccl_groups_started() -> list[str]:
    """Names of the NCCL process groups that already have an NCCL communicator: bound to a device
    (``init_process_group(device_id=...)`` creates it eagerly; ``ProcessGroup.bound_device_id``) or with a
    collective issued (a sequence number above 0). Checked on torch 2.13 (CPU build: no NCCL group exists)."""
    import torch.distributed as dist

    started = []
    for group, name in process_group_names().items():
        if "nccl" not in str(dist.get_backend(group)):
            continue
        if getattr(group, "bound_device_id", None) is not None or sequence_number(group) > 0:
            started.append(str(name))
    return started


def register_on_completion_hook(group, hook) -> None:
    """Call ``hook(info)`` on NCCL's watchdog thread as each collective of ``group`` completes, with its
    CUDA-event duration when TORCH_NCCL_ENABLE_TIMING=1 (``ProcessGroupNCCL._register_on_completion_hook``)."""
    group._register_on_completion_hook(hook)


def functional_collectives():
    """The module DTensor's collectives wait through (``torch.distributed._functional_collectives``)."""
    import torch.distributed._functional_collectives as funcol

    return funcol


def flight_recorder_dumps() -> list:
    """Flight Recorder's dump functions of this build, NCCL's recorder first (``_dump_nccl_trace``, present on
    NCCL builds; ``_dump_fr_trace``, the generic recorder gloo writes to). Each returns the dump as a pickle."""
    import torch

    c10d = torch._C._distributed_c10d
    return [f for name in ("_dump_nccl_trace", "_dump_fr_trace") if (f := getattr(c10d, name, None)) is not None]


def cuda_memory_stats(device_index: int) -> dict:
    """The caching allocator's nested statistics (``torch._C._cuda_memoryStats``): ``memory_stats()`` flattens
    about a hundred entries in Python on every call, which a per-step reading cannot afford."""
    import torch

    return torch._C._cuda_memoryStats(device_index)


def pipeline_schedule_class():
    """The base class of torch.distributed.pipelining's schedules (``schedules._PipelineSchedule``)."""
    from torch.distributed.pipelining.schedules import _PipelineSchedule

    return _PipelineSchedule


def run_frames_eagerly(code) -> None:
    """Have dynamo run ``code`` and every frame it calls eagerly wherever it meets them as frames of their own,
    instead of tracing them (``torch._C._dynamo.eval_frame.set_code_exec_strategy``, ``FrameAction.SKIP`` for
    the frame and its callees; what ``torch._dynamo.eval_frame.skip_code`` does for one frame). The hooks of a
    module compiled with ``torch.compile(module)`` run outside the compiled forward, each met as such a frame:
    traced, a clock read in them is a graph break. Where dynamo inlines the function into a region it traces,
    this does not apply (the caller returns on ``torch.compiler.is_compiling()`` there). Checked on torch 2.13;
    older releases may lack it."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
