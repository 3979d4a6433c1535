"""How fast the machine is running for this job: a small fixed workload timed on the rank's device.

A comparison of two runs cannot tell "the job got slower" from "the machine ran slower" (another job on the
same cores, a GPU at a lower clock) from the job's own step times. So each rank times the same small workload at
``diag.init``, every ``calibrate_every`` steps and at ``diag.finish``, and writes one ``calibration`` row
(diag/trace/schema.py); ``diag compare`` and ``diag analyze`` read each run's machine speed from them
(diag/analysis/calibration.py).

* CPU: a float32 matmul on the job's own intra-op threads (``torch.get_num_threads()``). Other load on the cores
  takes time slices from it as it does from the job's compute; its *mean* repetition is what the machine gives
  (the fastest one is what the core can do unhindered, kept beside it). The repetitions together span a few
  scheduler time slices, so a burner beside the job shows in it.
* CUDA: a bfloat16 matmul on the current stream, timed with CUDA events (what the GPU's clock and power state
  make of a fixed kernel), with the SM clock, its maximum, the performance state and the clock-event reasons from
  NVML right after.

It runs between steps (after the step's row is taken, before the next begins), so the step times never include
it, and never while a CUDA graph is being captured or torch.compile is tracing (it would be recorded into the
graph). Its cost is about a fifth of one step of a small MLP (tests/unit/compare/test_calibration.py checks it stays
under a tenth of the steps' time at every 10 steps; the default is every 200). Any failure is one warning, and
calibration stops; training goes on.
"""

from __future__ import annotations

import os
import threading
import time

from diag._warn import warn_once
from diag.capture.components import Component
from diag.trace.schema import CALIBRATION

DEFAULT_CALIBRATE_EVERY = 200  # steps between calibrations (also one at init and one at finish)
CPU_SIZE = 192  # CPU: a CPU_SIZE^2 matmul, ~14 MFLOP: ~0.3-1 ms on one core
CPU_REPEATS = 5  # timed repetitions: ~1-2 ms in all on an idle core
CUDA_SIZE = 4096  # CUDA: a 4096^2 bfloat16 matmul, ~137 GFLOP: well under a millisecond on a datacenter GPU
CUDA_REPEATS = 10


class Calibrator(Component):
    """Times the fixed workload on ``device`` and writes a ``calibration`` row. ``run`` never raises."""

    def __init__(self, writer, device, nvml_handle_source=None, every: int = DEFAULT_CALIBRATE_EVERY):
        self.every = every
        self._steps_since = 0
        self._last_step = -1  # the last completed step
        self.writer = writer
        self.device = device
        self._nvml_source = nvml_handle_source  # () -> (nvml module, handle) or None: the GPU's clocks
        self._inputs = None
        self.enabled = True
        self.last_cost_s = 0.0  # wall time of the last calibration, all included (its cost to the job)
        self.costs_s: list[float] = []  # every calibration's, in order (init's first)
        self._sched = SchedStats()

    def step_recorded(self, step: int, completed: bool) -> None:
        """Every ``every`` completed steps, after the step's row (never inside a step's timing)."""
        if not completed:
            return
        self._last_step = step
        self._steps_since += 1
        if self._steps_since >= self.every:
            self._steps_since = 0
            self.run(step)

    def stop(self) -> None:
        self.run(self._last_step)

    def run(self, step: int) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        try:
            if _capturing_or_compiling():
                return
            row = self._measure_cuda(step) if self._is_cuda() else self._measure_cpu(step)
            cpu_us, wait_us = self._sched.since_last()
            self.writer.append("calibration", row._replace(interval_cpu_us=cpu_us, interval_runqueue_wait_us=wait_us))
        except Exception as exc:
            self.enabled = False
            warn_once("calibration", f"machine-speed calibration failed ({exc!r}); it is off for this run")
        finally:
            self.last_cost_s = time.perf_counter() - started
            self.costs_s.append(self.last_cost_s)

    def _is_cuda(self) -> bool:
        return self.device is not None and getattr(self.device, "type", None) == "cuda"

    def _measure_cpu(self, step: int):
        import torch

        if self._inputs is None:
            generator = torch.Generator().manual_seed(0)
            self._inputs = [torch.rand(CPU_SIZE, CPU_SIZE, generator=generator) for _ in range(2)]
        a, b = self._inputs
        began_us = time.time_ns() // 1000
        torch.mm(a, b)  # warm-up: first-call dispatch, thread-pool wake-up
        times_ns = []
        for _ in range(CPU_REPEATS):
            t0 = time.perf_counter_ns()
            torch.mm(a, b)
            times_ns.append(time.perf_counter_ns() - t0)
        return CALIBRATION.row(
            step=step,
            time_us=began_us,
            device="cpu",
            threads=torch.get_num_threads(),
            repeats=CPU_REPEATS,
            flops=2 * CPU_SIZE**3,
            duration_us=sum(times_ns) / len(times_ns) / 1000,
            min_duration_us=min(times_ns) / 1000,
        )

    def _measure_cuda(self, step: int):
        import torch

        if self._inputs is None:
            generator = torch.Generator(device=self.device).manual_seed(0)
            self._inputs = [
                torch.rand(CUDA_SIZE, CUDA_SIZE, generator=generator, device=self.device, dtype=torch.bfloat16)
                for _ in range(2)
            ]
        a, b = self._inputs
        began_us = time.time_ns() // 1000
        torch.mm(a, b)  # warm-up
        events = [torch.cuda.Event(enable_timing=True) for _ in range(CUDA_REPEATS + 1)]
        events[0].record()
        for event in events[1:]:
            torch.mm(a, b)
            event.record()
        events[-1].synchronize()
        times_ms = [start.elapsed_time(end) for start, end in zip(events, events[1:], strict=False)]
        clocks = self._clocks()
        return CALIBRATION.row(
            step=step,
            time_us=began_us,
            device="cuda",
            threads=torch.get_num_threads(),
            repeats=CUDA_REPEATS,
            flops=2 * CUDA_SIZE**3,
            duration_us=1000 * sum(times_ms) / len(times_ms),
            min_duration_us=1000 * min(times_ms),
            **clocks,
        )

    def _clocks(self) -> dict:
        source = self._nvml_source() if self._nvml_source is not None else None
        if source is None:
            return {}
        from diag.metrics.nvml import read_clocks

        nvml, handle = source
        return read_clocks(nvml, handle)


def start_calibration(session) -> Calibrator | None:
    """Run once now (after the clock sync, so the ranks run it together), then every ``calibrate_every`` steps."""
    every = session.config.calibrate_every if session.writer.enabled else 0
    if not every:
        session.capture_status["calibration"] = "off"
        return None
    cuda = session.device.type == "cuda"
    calibrator = Calibrator(session.writer, session.device, _nvml_source(session) if cuda else None, every)
    calibrator.run(-1)
    session.capture_status["calibration"] = f"on: at init, every {every} steps and at finish"
    return calibrator


def _nvml_source(session):
    """() -> (nvml, handle) of this rank's GPU for the clocks: the telemetry sampler's, else opened once here;
    None without NVML (the calibration then has no clocks)."""
    own = []

    def source():
        if session.telemetry is not None:
            return session.telemetry.nvml, session.telemetry.handle
        if not own:
            own.append(None)
            try:
                from diag.capture.nvml import _handle_of
                from diag.metrics.nvml import open_nvml

                nvml, _ = open_nvml()
                if nvml is not None:
                    own[0] = (nvml, _handle_of(nvml, session.device)[0])
            except Exception:  # noqa: BLE001 - no clocks, the timing itself still counts
                own[0] = None
        return own[0]

    return source


class SchedStats:
    """The CPU time the training thread ran, and the time it was ready to run but waited for a core, since the
    previous reading (Linux ``/proc/self/task/TID/schedstat``: on-CPU ns, run-queue wait ns, time slices).
    Other load on the machine shows as run-queue wait; (cpu + wait) / cpu is how much longer the job's compute
    took than on a core of its own. The training thread only (the one that calls ``diag.step``, where the
    calibration runs): the process's other threads (gloo's, diag's writer) wake often for little work, and their
    waits, summed with it, said a 3-rank job on a loaded 2-core machine waited 15 ms per ms of CPU while its
    steps took 3x their CPU time. None, None where the kernel does not keep them (not Linux)."""

    def __init__(self):
        self._path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self.available = os.path.exists(self._path)
        self._last = self._read() if self.available else None  # what the thread did before init is not the run's

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self._path, "rb") as handle:
                fields = handle.read().split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    def since_last(self) -> tuple[float | None, float | None]:
        if not self.available:
            return None, None
        now = self._read()
        if now is None or self._last is None:
            self.available = False
            return None, None
        cpu_ns, wait_ns = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return max(cpu_ns, 0) / 1000, max(wait_ns, 0) / 1000


class ThreadRunQueueWait:
    """The calling thread's cumulative run-queue wait (time ready to run but without a core) in ns, from
    Linux schedstat, or None where the kernel does not keep it. One open file per thread, re-read in place
    (a few microseconds) and kept for the process's life: a pipeline stage reads it around each action, and
    the session around each step, so that time spent waiting for a core on a loaded host is not taken for the
    rank's own work. One instance per process (``CORE_WAIT``), so that the files are opened once per thread."""

    def __init__(self):
        self._files: dict[int, int] = {}  # native thread id -> open descriptor of its schedstat
        self.available = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat")

    def read_ns(self) -> int | None:
        both = self.read_cpu_and_wait_ns()
        return both[1] if both is not None else None

    def read_cpu_and_wait_ns(self) -> tuple[int, int] | None:
        """(time on a core, time waiting for one) of the calling thread so far, in ns: one read gives both."""
        if not self.available:
            return None
        thread_id = threading.get_native_id()
        try:
            descriptor = self._files.get(thread_id)
            if descriptor is None:
                descriptor = os.open(f"/proc/self/task/{thread_id}/schedstat", os.O_RDONLY)
                self._files[thread_id] = descriptor
            fields = os.pread(descriptor, 128, 0).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            self.available = False
            return None


CORE_WAIT = ThreadRunQueueWait()  # one per process: its files are per thread, opened on a thread's first read


def _capturing_or_compiling() -> bool:
    """A CUDA graph being captured or torch.compile tracing: a matmul now would become part of the graph."""
    import torch

    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
        return True
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def calibrate_every_problem(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"calibrate_every must be a whole number of steps >= 0 (0: no calibration), not {value!r}"
    return None
