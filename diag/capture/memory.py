"""Per-step memory: the CUDA caching allocator's counters (host-side, no device sync) and process RSS."""

from __future__ import annotations

import os
import resource
import time

from diag.capture import torch_private
from diag.capture.components import Component
from diag.capture.memory_categories import MemoryCategories
from diag.trace.schema import MEMORY

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm: tuple[int, int] | None = None  # (pid, fd): a forked child must not read its parent's file


def rss_bytes() -> int:
    """Resident set size. /proc/self/statm stays open and is re-read with pread: opening it each step cost
    more than everything else diag does in a step."""
    global _statm
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):  # not Linux: peak RSS is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemorySampler(Component):
    """Reads memory at the end of each step; on CUDA resets the peaks so each row's peak is its step's.

    RSS is read at most every ``RSS_INTERVAL_NS`` and a row carries the latest reading: it moves slowly, and
    the read is a system call, which on kernels with page-table isolation flushes the TLB and cost ~20 us of
    a 3.5 ms CPU step in refills (docs/benchmarks.md), four times the rest of a step span."""

    RSS_INTERVAL_NS = 100_000_000

    def __init__(self, device, writer=None):
        self.writer = writer
        self.cuda_device = device if getattr(device, "type", None) == "cuda" else None
        self.categories = MemoryCategories(device)
        self._rss = 0
        self._rss_read_ns = -self.RSS_INTERVAL_NS

    def step_recorded(self, step: int, completed: bool) -> None:
        self.writer.append("memory", self.sample(step))

    def sample(self, step: int) -> tuple:
        stats = {}
        if self.cuda_device is not None:
            import torch

            stats = _allocator_stats(torch, self.cuda_device)
            torch.cuda.reset_peak_memory_stats(self.cuda_device)
        now_ns = time.monotonic_ns()
        if now_ns - self._rss_read_ns >= self.RSS_INTERVAL_NS:
            self._rss, self._rss_read_ns = rss_bytes(), now_ns
        categories = self.categories
        if categories.tracking:
            categories.on_step_end(step)
        return memory_row(step, time.time_ns() // 1000, stats, self._rss, categories)

    def oom_fields(self, step: int | None) -> dict:
        """What memory looked like at an out-of-memory error: the allocator's counters and the categories,
        measured now (the cost does not matter any more)."""
        stats = {}
        if self.cuda_device is not None:
            import torch

            stats = _allocator_stats(torch, self.cuda_device, detailed=True)
        if self.categories.tracking:
            self.categories.measure(step)
        return oom_event_fields(stats, self.categories)

    def summary(self) -> str | None:
        """The allocator's full memory_summary(), written when a step runs out of memory."""
        if self.cuda_device is None:
            return None
        import torch

        return torch.cuda.memory_summary(self.cuda_device)


def start_memory(session) -> MemorySampler | None:
    enabled = session.config.memory and session.writer.enabled
    session.capture_status["memory"] = "on" if enabled else "off"
    return MemorySampler(session.device, session.writer) if enabled else None


def _allocator_stats(torch, device, detailed: bool = False) -> dict:
    """The few allocator counters a memory row needs, in ``memory_stats()``'s flat key names. The raw nested
    statistics are read directly: ``memory_stats()`` flattens ~100 entries in Python on every call.
    ``detailed``: all of ``memory_stats()`` (at an OOM, where the cost does not matter)."""
    if detailed:
        return torch.cuda.memory_stats(device)
    try:
        raw = torch_private.cuda_memory_stats(device.index if device.index is not None else torch.cuda.current_device())
        return {
            "allocated_bytes.all.current": raw["allocated_bytes"]["all"]["current"],
            "allocated_bytes.all.peak": raw["allocated_bytes"]["all"]["peak"],
            "reserved_bytes.all.current": raw["reserved_bytes"]["all"]["current"],
            "reserved_bytes.all.peak": raw["reserved_bytes"]["all"]["peak"],
            "num_alloc_retries": raw["num_alloc_retries"],
            "num_ooms": raw["num_ooms"],
        }
    except (AttributeError, KeyError, TypeError):  # another torch layout: the public, slower call
        return torch.cuda.memory_stats(device)


def memory_row(step: int, time_us: int, stats: dict, rss: int, categories: MemoryCategories | None = None) -> tuple:
    """A ``memory`` row from ``torch.cuda.memory_stats()`` (empty on CPU), the process RSS and the latest
    measurement of the categories (empty when no model or optimizer is instrumented)."""
    known = categories is not None and categories.measured_step is not None
    return MEMORY.row(
        step=step,
        time_us=time_us,
        allocated_bytes=stats.get("allocated_bytes.all.current"),
        allocated_peak_bytes=stats.get("allocated_bytes.all.peak"),
        reserved_bytes=stats.get("reserved_bytes.all.current"),
        reserved_peak_bytes=stats.get("reserved_bytes.all.peak"),
        alloc_retries=stats.get("num_alloc_retries"),
        ooms=stats.get("num_ooms"),
        rss_bytes=rss,
        param_bytes=categories.param_bytes if known else None,
        grad_bytes=categories.grad_bytes if known else None,
        optimizer_state_bytes=categories.optimizer_state_bytes if known else None,
        categories_step=categories.measured_step if known else None,
    )


# memory_stats() keys an ``oom`` event keeps (flat names), under the event's own names
_OOM_STATS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}


def oom_event_fields(stats: dict, categories: MemoryCategories | None) -> dict:
    """The fields an ``oom`` event adds to its message: the allocator's counters at that moment (from
    ``torch.cuda.memory_stats()``; none on CPU) and the categories, when a model or optimizer is instrumented."""
    fields = {name: stats[key] for name, key in _OOM_STATS.items() if stats.get(key) is not None}
    if categories is not None and categories.measured_step is not None:
        fields.update(
            param_bytes=categories.param_bytes,
            grad_bytes=categories.grad_bytes,
            optimizer_state_bytes=categories.optimizer_state_bytes,
        )
    return fields


def is_out_of_memory(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except Exception:
        pass
    text = str(exc).lower()
    # CUDA's "out of memory", and the CPU allocator's "DefaultCPUAllocator: can't allocate memory"
    return isinstance(exc, (MemoryError, RuntimeError)) and ("out of memory" in text or "can't allocate memory" in text)
