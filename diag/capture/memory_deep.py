"""The opt-in deep memory mode: for a few steps chosen by the user, what is behind the step's memory peak.

Two recorders, each converted into plain numbers and names *at capture time* and written as one small JSON side
file, ``memory_deep.json`` (schema: ``MEMORY_DEEP_KEYS``), once the last chosen step ends. Nothing torch pickles
is ever written: a trace directory is data, and loading it must never execute code.

* **By module** (CPU and CUDA): ``torch.distributed._tools.mem_tracker.MemTracker``, a TorchDispatchMode that
  sees every tensor storage created during the step and which module's forward or backward was running. diag
  subclasses it to keep, per module, the bytes of the activations and temporaries it created that are still
  alive, and copies those at the moment the step's tracked memory peaks on this rank's device.
* **By stack** (CUDA only): the caching allocator's history with Python stacks
  (``torch.cuda.memory._record_memory_history``), read with ``torch.cuda.memory._snapshot()`` after the last
  step; replaying its alloc/free entries finds the peak and the allocations alive then, grouped by stack.

Both are expensive (every operator goes through Python; docs/benchmarks.md measures it), which is why only a
few steps. Any failure is one DiagWarning and the mode turns off; the training loop never sees an exception.
"""

from __future__ import annotations

import contextlib
import json
import time

from diag._warn import warn_once
from diag.capture.components import Component
from diag.trace.schema import MEMORY_DEEP_FILE, MEMORY_DEEP_FORMAT

MAX_DEEP_STEPS = 10  # "a few steps": each tracked step runs several times slower
HISTORY_MAX_ENTRIES = 200_000  # allocator trace entries kept (a ring buffer; torch: "several KB" each)
TOP_ALLOCATIONS = 20  # stacks kept in the side file, most bytes first
TOP_MODULES = 30  # modules kept, most bytes first
MAX_FRAMES = 16  # frames kept per stack, innermost first

# MemTracker's reference types -> the category names diag uses; activations and temporaries go to modules
_CATEGORY_OF_KIND = {
    "Parameter": "param_bytes",
    "Buffer": "buffer_bytes",
    "Gradient": "grad_bytes",
    "Optstate": "optimizer_state_bytes",
    "Other": "other_bytes",
    "Activation": "activation_bytes",
    "Temp": "temporary_bytes",
}
_MODULE_KINDS = ("Activation", "Temp")
NO_MODULE = "(outside any module)"


def deep_steps_problem(value) -> str | None:
    """Why ``memory_deep_steps`` is not a (start step, count) pair, or None when it is (or is None)."""
    if value is None:
        return None
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] >= 0
        and 1 <= value[1] <= MAX_DEEP_STEPS
    )
    if ok:
        return None
    return f"memory_deep_steps must be (first step >= 0, count 1-{MAX_DEEP_STEPS}) or None, not {value!r}"


class DeepMemory(Component):
    """Records steps ``first`` .. ``first + count - 1`` and writes ``memory_deep.json`` after the last one (or at
    a failed step, or at ``diag.finish``). ``categories``: the instrumented model and optimizer, whose parameters,
    gradients and optimizer state existed before the step and are told to the module tracker."""

    def __init__(self, writer, device, categories, first: int, count: int):
        self.writer = writer
        self.device = device
        self.categories = categories
        self.first, self.last = first, first + count - 1
        self.cuda = getattr(device, "type", None) == "cuda"
        self.done = False
        self._tracker = None
        self._step_results: list[dict] = []
        self._windows_us: dict[int, tuple[int, int]] = {}
        self._step_start_us = 0
        self._history = None  # _AllocatorHistory while recording on CUDA
        self.status = f"on: steps {self.first}-{self.last}"

    def wants(self, step: int | None) -> bool:
        return not self.done and step is not None and self.first <= step <= self.last

    # -- the training thread's two calls ---------------------------------------------------------------------
    def step_begin(self, step: int | None) -> None:
        """Last thing before the user's step runs: anything diag does after this would be tracked too."""
        if not self.wants(step):
            return
        try:
            if self.cuda and self._history is None:
                self._history = _AllocatorHistory(self.device)
            self._step_start_us = time.time_ns() // 1000
            self._tracker = _new_tracker(self.device, self._give_up)
            externals = _trackable(self.categories)
            if externals:
                self._tracker.track_external(*externals)
            self._tracker.__enter__()
        except Exception as exc:
            self._tracker = None
            self._give_up(exc)

    def step_end(self, step: int | None, completed: bool = True) -> None:
        """First thing after the user's step: the tracker leaves before diag's own end-of-step work."""
        tracker, self._tracker = self._tracker, None
        if tracker is None:  # not a chosen step (or the mode is off): nothing else to pay
            return
        try:
            tracker.__exit__(None, None, None)
            self._windows_us[step] = (self._step_start_us, time.time_ns() // 1000)
            if tracker.failed is None:
                self._step_results.append(tracker.result(step))
            if not completed or step >= self.last:
                self.finish()
        except Exception as exc:
            self._give_up(exc)

    def finish(self) -> None:
        """Convert and write what was recorded (also from diag.finish when the last chosen step never came)."""
        if self.done:
            return
        self.done = True
        history, self._history = self._history, None
        try:
            allocations = history.stop_and_summarise(self._windows_us) if history is not None else None
            if not self._step_results and allocations is None:
                return
            self.writer.write_text(MEMORY_DEEP_FILE, json.dumps(self.payload(allocations), separators=(",", ":")))
        except Exception as exc:
            self._give_up(exc)

    stop = finish  # diag.finish: the last chosen step never came, write what was recorded

    def payload(self, allocations: dict | None) -> dict:
        peak = max(self._step_results, key=lambda r: r["peak_bytes"], default=None)
        return {
            "format": MEMORY_DEEP_FORMAT,
            "device": str(self.device),
            "steps": sorted(self._windows_us) or [self.first],
            "step_peaks": [{"step": r["step"], "peak_bytes": r["peak_bytes"]} for r in self._step_results],
            "modules": peak,
            "allocations": allocations,
        }

    def _give_up(self, exc: BaseException) -> None:
        """One warning; the tracker stops seeing operators and the allocator history is stopped."""
        warn_once("memory-deep", f"the deep memory mode stopped ({exc!r}); training goes on without it")
        self.done = True
        self.status = f"off: {exc!r}"[:200]
        if self._tracker is not None:
            self._tracker.failed = self._tracker.failed or repr(exc)
        history, self._history = self._history, None
        if history is not None:
            with contextlib.suppress(Exception):
                history.stop()


def start_memory_deep(session) -> DeepMemory | None:
    """The opt-in mode, for the steps of ``memory_deep_steps`` (None: off, and its status not in the manifest)."""
    steps = session.config.memory_deep_steps if session.writer.enabled else None
    if steps is None:
        return None
    try:
        categories = session.memory.categories if session.memory is not None else None
        deep = DeepMemory(session.writer, session.device, categories, *steps)
    except Exception as exc:  # the rest of capture goes on without it
        warn_once("memory-deep", f"the deep memory mode could not start ({exc!r}); it is off")
        session.capture_status["memory_deep"] = f"off: could not start ({exc!r})"
        return None
    session.capture_status["memory_deep"] = deep.status
    return deep


def _trackable(categories) -> list:
    """What MemTracker.track_external accepts of the instrumented objects (it raises on anything else): modules,
    and torch optimizers, also inside a wrapper (DeepSpeed's and Accelerate's keep theirs in ``.optimizer``)."""
    import torch

    if categories is None:
        return []
    out = list(categories.modules)
    for optimizer in categories.optimizers:
        inner = optimizer if isinstance(optimizer, torch.optim.Optimizer) else getattr(optimizer, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            out.append(inner)
    return out


# -- by module: MemTracker ---------------------------------------------------------------------------------------
def _new_tracker(device, on_error):
    """A MemTracker that also attributes live activation and temporary bytes to the module that created them,
    and never raises into the step: its hooks run inside the user's forward and backward."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    wanted = torch.device(device)
    if wanted.type == "cuda" and wanted.index is None:
        wanted = torch.device("cuda", torch.cuda.current_device())

    class ModuleMemoryTracker(MemTracker):
        def __init__(self):
            super().__init__()
            self.failed: str | None = None
            self.owner_bytes: dict[tuple[str, str], int] = {}  # (module or category, kind) -> bytes alive now
            self._owner_of: dict[int, tuple[str, str]] = {}  # id(storage info) -> its owner
            self.total_bytes = 0  # on this rank's device, now
            self.peak_bytes = 0
            self.peak_owner_bytes: dict[tuple[str, str], int] = {}
            self.peak_active: list[str] = []
            self.peak_phase: str | None = None

        def _guarded(self, function, *args):
            if self.failed is not None:
                return None
            try:
                return function(*args)
            except Exception as exc:  # a layout MemTracker does not know: stop tracking, never fail the step
                self.failed = repr(exc)
                on_error(exc)
                return None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.failed is not None:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _pre_fw_hook(self, module, inputs):
            self._guarded(self._pre_forward, module, inputs)

        def _pre_forward(self, module, inputs):
            try:
                MemTracker._pre_fw_hook(self, module, inputs)
            except NotImplementedError:
                # the root module's second forward in one step (gradient accumulation): MemTracker keeps one
                # iteration's per-module statistics and refuses; diag's attribution does not use them
                self.reset_mod_stats()
                MemTracker._pre_fw_hook(self, module, inputs)

        def _post_fw_hook(self, module, inputs, outputs):
            self._guarded(super()._post_fw_hook, module, inputs, outputs)

        def _pre_bw_hook(self, module, args):
            self._guarded(super()._pre_bw_hook, module, args)

        def _post_bw_hook(self, module, args):
            self._guarded(super()._post_bw_hook, module, args)

        def _track(self, reftype, t):
            self._guarded(super()._track, reftype, t)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            self._guarded(super()._update_snap, u_type, winfo, old_mem_consumed, old_reftype)
            if winfo.device == wanted:
                self._guarded(self._attribute, u_type, winfo, old_mem_consumed)

        def _attribute(self, u_type, winfo, old_mem_consumed) -> None:
            key = id(winfo)
            if u_type == _UpdateType.ADD:
                owner = self._owner(winfo.reftype.value, None)
                self._owner_of[key] = owner
                self._add(owner, winfo.mem_consumed)
            elif u_type == _UpdateType.DEL:
                owner = self._owner_of.pop(key, None)
                if owner is not None:
                    self._add(owner, -winfo.mem_consumed)
            elif u_type == _UpdateType.SIZE and key in self._owner_of:
                self._add(self._owner_of[key], winfo.mem_consumed - (old_mem_consumed or 0))
            elif u_type == _UpdateType.REF and key in self._owner_of:  # an activation became a gradient, ...
                old = self._owner_of[key]
                new = self._owner(winfo.reftype.value, old)
                self._add(old, -winfo.mem_consumed)
                self._add(new, winfo.mem_consumed)
                self._owner_of[key] = new

        def _owner(self, kind: str, previous: tuple[str, str] | None) -> tuple[str, str]:
            if kind not in _MODULE_KINDS:
                return ("", kind)
            if previous is not None and previous[0]:
                return (previous[0], kind)
            return (_innermost(self._mod_tracker.parents), kind)

        def _add(self, owner: tuple[str, str], nbytes: int) -> None:
            self.total_bytes += nbytes
            left = self.owner_bytes.get(owner, 0) + nbytes
            if left:
                self.owner_bytes[owner] = left
            else:
                self.owner_bytes.pop(owner, None)

        def _update_peak_stats(self, peak_state):
            # Called after every operator. MemTracker's own version walks every module it knows for their local
            # peaks, which diag does not report: replaced by the one comparison diag needs (it made a recorded
            # step 2.6x slower than an untracked one, against 1.6x without it, back to back: docs/benchmarks.md)
            if self.total_bytes > self.peak_bytes and self.failed is None:
                self.peak_bytes = self.total_bytes
                self.peak_owner_bytes = dict(self.owner_bytes)
                self.peak_active = sorted(p for p in self._mod_tracker.parents if p != "Global")
                self.peak_phase = "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else "forward"

        def result(self, step: int) -> dict:
            return module_result(step, self.peak_bytes, self.peak_phase, self.peak_active, self.peak_owner_bytes)

    return ModuleMemoryTracker()


def _innermost(parents) -> str:
    """The innermost module running now: ModTracker keeps the running modules' qualified names as a set, and
    a child's name extends its parent's."""
    names = [p for p in parents if p != "Global"]
    return max(names, key=lambda n: (n.count("."), len(n))) if names else NO_MODULE


def module_result(step: int, peak_bytes: int, phase: str | None, active: list[str], owners: dict) -> dict:
    """One step's module view at its peak, in plain numbers: bytes by category, and the activations and
    temporaries alive then, by the module whose forward (or backward) created them."""
    by_category = {name: 0 for name in _CATEGORY_OF_KIND.values()}
    modules: dict[str, dict[str, int]] = {}
    for (module, kind), nbytes in owners.items():
        category = _CATEGORY_OF_KIND.get(kind, "other_bytes")
        by_category[category] += nbytes
        if module:
            entry = modules.setdefault(module, {"activation_bytes": 0, "temporary_bytes": 0})
            entry["activation_bytes" if kind == "Activation" else "temporary_bytes"] += nbytes
    top = sorted(modules.items(), key=lambda item: -(item[1]["activation_bytes"] + item[1]["temporary_bytes"]))
    return {
        "step": step,
        "peak_bytes": int(peak_bytes),
        "phase": phase,
        "active_modules": active[:64],
        "by_category": by_category,
        "top_modules": [{"module": name, **sizes} for name, sizes in top[:TOP_MODULES]],
        "modules_total": len(modules),
    }


# -- by stack: the CUDA caching allocator's history ----------------------------------------------------------
class _AllocatorHistory:
    """The allocator's alloc/free history with Python stacks, from the first chosen step to the last. A history
    the user already records is read but left running."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)  # absent from older torch: assume not
        self.owned = not (enabled() if enabled is not None else False)
        self.start_allocated_bytes = int(torch.cuda.memory_allocated(self.index))
        if self.owned:
            torch.cuda.memory._record_memory_history(
                "all", context="alloc", stacks="python", max_entries=HISTORY_MAX_ENTRIES
            )

    def stop(self) -> None:
        if self.owned:
            self.owned = False
            self.torch.cuda.memory._record_memory_history(None)

    def stop_and_summarise(self, windows_us: dict[int, tuple[int, int]]) -> dict:
        try:
            snapshot = self.torch.cuda.memory._snapshot(self.index)
        finally:
            self.stop()
        return allocation_summary(snapshot, self.index, self.start_allocated_bytes, windows_us)


def allocation_summary(snapshot: dict, device_index: int, start_allocated_bytes: int, windows_us: dict) -> dict:
    """The peak of a ``torch.cuda.memory._snapshot()`` history and the allocations alive then, grouped by stack.

    Replays ``device_traces[device_index]``: ``alloc`` adds, ``free_completed`` removes (the allocator counts a
    block as allocated until then, as torch/cuda/_memory_viz.py's trace does). Memory allocated before recording
    began (``start_allocated_bytes``) has no entry: it is counted as "before recording" and lowered by frees of
    addresses the history never saw allocated."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device_index] if 0 <= device_index < len(traces) else []
    current = peak = int(start_allocated_bytes)
    peak_index = -1
    alive: dict[int, int] = {}
    for index, entry in enumerate(trace):
        action, size = entry.get("action"), int(entry.get("size") or 0)
        if action == "alloc":
            alive[entry.get("addr")] = size
            current += size
            if current > peak:
                peak, peak_index = current, index
        elif action == "free_completed":
            current -= alive.pop(entry.get("addr"), size)
    # a second pass to the peak: copying the live set at every new peak would be quadratic
    before, groups = int(start_allocated_bytes), {}
    live: dict[int, dict] = {}
    for entry in trace[: peak_index + 1]:
        action = entry.get("action")
        if action == "alloc":
            live[entry.get("addr")] = entry
        elif action == "free_completed" and live.pop(entry.get("addr"), None) is None:
            before -= int(entry.get("size") or 0)
    for entry in live.values():
        frames = _frames(entry.get("frames"))
        key = tuple((f["filename"], f["line"], f["name"]) for f in frames)
        group = groups.setdefault(key, {"bytes": 0, "count": 0, "frames": frames})
        group["bytes"] += int(entry.get("size") or 0)
        group["count"] += 1
    top = sorted(groups.values(), key=lambda g: -g["bytes"])
    peak_time = trace[peak_index].get("time_us") if peak_index >= 0 else None
    ooms = [
        {
            "bytes": int(e.get("size") or 0),
            "device_free_bytes": e.get("device_free"),
            "frames": _frames(e.get("frames")),
        }
        for e in trace
        if e.get("action") == "oom"
    ]
    return {
        "peak_bytes": int(peak),
        "peak_step": _step_at(peak_time, windows_us),
        "before_recording_bytes": max(before, 0),
        "entries": len(trace),
        "truncated": len(trace) >= HISTORY_MAX_ENTRIES,
        "top_allocations": top[:TOP_ALLOCATIONS],
        "stacks_total": len(groups),
        "ooms": ooms[:5],
    }


def _frames(frames) -> list[dict]:
    """A stack as plain {filename, line, name}, innermost first, without diag's own frames."""
    out = []
    for frame in frames or ():
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if "/diag/capture/" in filename:
            continue
        out.append({"filename": filename, "line": int(frame.get("line") or 0), "name": str(frame.get("name", ""))})
        if len(out) >= MAX_FRAMES:
            break
    return out


def _step_at(time_us, windows_us: dict[int, tuple[int, int]]) -> int | None:
    """The chosen step whose wall-clock window holds a trace entry's ``time_us``, or None. c10's
    CUDACachingAllocator says it converts its clock to "epoch time in microseconds"; a value a thousand times
    too large for that (nanoseconds, 1.7e18 in 2026, against 1.7e15) is read as nanoseconds."""
    if not isinstance(time_us, (int, float)) or isinstance(time_us, bool):
        return None
    for candidate in (time_us, time_us / 1000) if time_us > 1e17 else (time_us,):
        for step, (start_us, end_us) in windows_us.items():
            if start_us <= candidate <= end_us:
                return step
    return None
