"""What was behind a step's memory peak, from the deep memory mode's ``memory_deep.json`` (capture converted
torch's MemTracker and allocator history into plain numbers and names; see diag/capture/memory_deep.py).

Pure: reads the loaded dicts, checks each field (a bad entry is skipped and counted, never a crash) and names the
modules whose activations and temporaries were alive at the peak and the allocation stacks holding most then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TOP_SHOWN = 5
# torch's own frames (nn.Module's call machinery, functional wrappers) say how, not where: the first frame
# outside them is the user's code (or a model library's, which is as useful)
_LIBRARY_FRAME = re.compile(r"[/\\]torch[/\\]|^<frozen |[/\\]diag[/\\]capture[/\\]")


@dataclass
class DeepModule:
    module: str
    activation_bytes: int
    temporary_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.temporary_bytes


@dataclass
class DeepAllocation:
    """Allocations alive at the allocator's peak that share one stack."""

    bytes: int
    count: int
    site: str | None  # "file:line in function" of the first frame outside torch, None without frames
    frames: list[str] = field(default_factory=list)  # "file:line in function", innermost first

    def frames_from_site(self) -> tuple[list[str], int]:
        """The stack from its first frame outside torch outwards, and how many torch frames inside it were
        left out (on CUDA the innermost are the dispatcher's and MemTracker's: how, not where)."""
        for index, frame in enumerate(self.frames):
            if not _LIBRARY_FRAME.search(frame):
                return self.frames[index:], index
        return self.frames, 0


@dataclass
class DeepMemory:
    """One rank's deep-mode steps: the module view at the highest step peak and, on CUDA, the allocator's."""

    rank: int
    device: str | None
    steps: list[int]
    peak_step: int | None = None  # the recorded step with the highest tracked peak
    peak_bytes: int | None = None  # tensor memory the module tracker saw at that peak
    phase: str | None = None  # forward, backward or optimizer
    active_modules: list[str] = field(default_factory=list)  # modules running at the peak
    by_category: dict = field(default_factory=dict)  # param_bytes, grad_bytes, ..., activation_bytes at the peak
    top_modules: list[DeepModule] = field(default_factory=list)  # most live activations and temporaries first
    modules_total: int | None = None
    allocation_peak_bytes: int | None = None  # CUDA: the allocator's peak during the recorded steps
    allocation_peak_step: int | None = None
    before_recording_bytes: int | None = None  # allocated before the first recorded step, alive at the peak
    history_truncated: bool = False
    top_allocations: list[DeepAllocation] = field(default_factory=list)
    stacks_total: int | None = None
    oom_requests: list[int] = field(default_factory=list)  # bytes asked by allocations that ran out of memory
    skipped_entries: int = 0  # malformed entries of the file, left out


def analyze_memory_deep(files: dict[int, dict]) -> list[DeepMemory]:
    """Per rank that ran the deep mode, by rank."""
    return [deep_of(rank, files[rank]) for rank in sorted(files)]


def deep_of(rank: int, data: dict) -> DeepMemory:
    bad = [0]
    steps = [s for s in _list(data.get("steps")) if _is_int(s)]
    out = DeepMemory(rank=int(rank), device=_str(data.get("device")), steps=steps)
    modules = data.get("modules")
    if isinstance(modules, dict):
        _add_modules(out, modules, bad)
    elif modules is not None:
        bad[0] += 1
    allocations = data.get("allocations")
    if isinstance(allocations, dict):
        _add_allocations(out, allocations, bad)
    elif allocations is not None:
        bad[0] += 1
    out.skipped_entries = bad[0]
    return out


def _add_modules(out: DeepMemory, modules: dict, bad: list[int]) -> None:
    out.peak_step = _int(modules.get("step"))
    out.peak_bytes = _int(modules.get("peak_bytes"))
    out.phase = _str(modules.get("phase"))
    out.active_modules = [str(m) for m in _list(modules.get("active_modules")) if isinstance(m, str)]
    categories = modules.get("by_category")
    if isinstance(categories, dict):
        out.by_category = {str(k): int(v) for k, v in categories.items() if _is_int(v) and v >= 0}
    for entry in _list(modules.get("top_modules")):
        act, tmp = (
            _int(entry.get(k)) if isinstance(entry, dict) else None for k in ("activation_bytes", "temporary_bytes")
        )
        name = entry.get("module") if isinstance(entry, dict) else None
        if not isinstance(name, str) or act is None or tmp is None or act < 0 or tmp < 0:
            bad[0] += 1
            continue
        out.top_modules.append(DeepModule(name, act, tmp))
    out.top_modules.sort(key=lambda m: -m.total_bytes)
    out.modules_total = _int(modules.get("modules_total"))


def _add_allocations(out: DeepMemory, allocations: dict, bad: list[int]) -> None:
    out.allocation_peak_bytes = _int(allocations.get("peak_bytes"))
    out.allocation_peak_step = _int(allocations.get("peak_step"))
    out.before_recording_bytes = _int(allocations.get("before_recording_bytes"))
    out.history_truncated = allocations.get("truncated") is True
    out.stacks_total = _int(allocations.get("stacks_total"))
    for entry in _list(allocations.get("top_allocations")):
        nbytes = _int(entry.get("bytes")) if isinstance(entry, dict) else None
        if nbytes is None or nbytes < 0:
            bad[0] += 1
            continue
        frames = [_frame_text(f) for f in _list(entry.get("frames"))]
        if None in frames:
            bad[0] += 1
            frames = [f for f in frames if f is not None]
        out.top_allocations.append(DeepAllocation(nbytes, _int(entry.get("count")) or 1, _site(entry), frames))
    out.top_allocations.sort(key=lambda a: -a.bytes)
    out.oom_requests = [
        int(o["bytes"]) for o in _list(allocations.get("ooms")) if isinstance(o, dict) and _is_int(o.get("bytes"))
    ]


def _frame_text(frame) -> str | None:
    if not isinstance(frame, dict) or not isinstance(frame.get("filename"), str):
        return None
    line = frame.get("line")
    return f"{frame['filename']}:{line if _is_int(line) else '?'} in {frame.get('name') or '?'}"


def _site(entry: dict) -> str | None:
    """The first frame of a stack that is not torch's (innermost first), or the innermost one."""
    frames = [f for f in _list(entry.get("frames")) if isinstance(f, dict) and isinstance(f.get("filename"), str)]
    for frame in frames:
        if not _LIBRARY_FRAME.search(frame["filename"]):
            return _frame_text(frame)
    return _frame_text(frames[0]) if frames else None


def deep_lines(deep: DeepMemory, byte_text) -> list[str]:
    """A rank's deep-mode result in a few sentences (the text view and the findings' evidence use them)."""
    where = f"rank {deep.rank}"
    lines = []
    if deep.peak_bytes is not None:
        step = f" in step {deep.peak_step}" if deep.peak_step is not None else ""
        during = f", during the {deep.phase}" if deep.phase else ""
        running = f" (running: {_innermost(deep.active_modules)})" if deep.active_modules else ""
        lines.append(f"{where}: tensor memory peaked at {byte_text(deep.peak_bytes)}{step}{during}{running}")
        held = [(k, v) for k, v in deep.by_category.items() if v]
        if held:
            lines.append(
                f"{where} at the peak: "
                + ", ".join(
                    f"{_CATEGORY_TEXT.get(k, k)} {byte_text(v)}" for k, v in sorted(held, key=lambda kv: -kv[1])
                )
            )
        if deep.top_modules:
            lines.append(
                f"{where}: live activations and temporaries by module: "
                + ", ".join(f"{m.module} {byte_text(m.total_bytes)}" for m in deep.top_modules[:TOP_SHOWN])
            )
    if deep.allocation_peak_bytes is not None:
        step = f" in step {deep.allocation_peak_step}" if deep.allocation_peak_step is not None else ""
        lines.append(f"{where}: the allocator peaked at {byte_text(deep.allocation_peak_bytes)}{step}")
        for a in deep.top_allocations[:3]:
            lines.append(
                f"{where}: {byte_text(a.bytes)} in {a.count} allocation(s) from {a.site or 'an unknown stack'}"
            )
    return lines


_CATEGORY_TEXT = {
    "param_bytes": "parameters",
    "buffer_bytes": "buffers",
    "grad_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
    "activation_bytes": "activations",
    "temporary_bytes": "temporaries",
    "other_bytes": "other",
}


def _innermost(active: list[str]) -> str:
    return max(active, key=lambda n: (n.count("."), len(n)))


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value) -> int | None:
    return int(value) if _is_int(value) else None


def _str(value) -> str | None:
    return value if isinstance(value, str) else None
