"""GPU telemetry from NVML (nvidia-ml-py), sampled by a background thread for the rank's own GPU. Reading and
decoding NVML is ``diag.metrics.nvml``'s, shared with the node agent; this module finds the rank's GPU (through
torch) and runs the sampling thread."""

from __future__ import annotations

import logging
import os
import threading

from diag._warn import warn_once
from diag.capture.components import Component
from diag.metrics.nvml import XidEvents, decode_sample, read_sample

log = logging.getLogger("diag")

_MAX_CONSECUTIVE_FAILURES = 5


class TelemetrySampler(Component):
    """Samples one GPU every ``interval_s`` on a daemon thread; stops with one warning if NVML fails."""

    def __init__(self, writer, nvml, handle, gpu_index: int, interval_s: float):
        self.writer = writer
        self.nvml = nvml
        self.handle = handle
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diag-nvml", daemon=True)
        self._xids = XidEvents(nvml, {gpu_index: handle})

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                sample = read_sample(self.nvml, self.handle)
                self._xids.poll()
                self.writer.append(
                    "telemetry",
                    decode_sample(sample, self.gpu_index, self._xids.next_for(self.gpu_index), os.getpid()),
                )
                failures = 0
            except Exception as exc:
                failures += 1
                if failures >= _MAX_CONSECUTIVE_FAILURES:
                    warn_once("nvml-failed", f"NVML keeps failing ({exc!r}); GPU telemetry stopped")
                    return
            self._stop.wait(self.interval_s)


def start_telemetry(session) -> TelemetrySampler | None:
    """Sample the rank's GPU, when the ``telemetry`` option is on; what happened in the capture status."""
    if not (session.config.telemetry and session.writer.enabled):
        session.capture_status["telemetry"] = "off"
        return None
    cuda_device = session.device if session.device.type == "cuda" else None
    sampler, status = _start_sampler(session.writer, cuda_device, session.config.telemetry_interval_s)
    session.capture_status["telemetry"] = status
    if sampler is None and session.identity.local_rank == 0:
        log.warning("diag: GPU telemetry %s", status)
    return sampler


def _start_sampler(writer, cuda_device, interval_s: float) -> tuple[TelemetrySampler | None, str]:
    """Start sampling the GPU behind ``cuda_device``. Returns (sampler or None, what happened, in words)."""
    if cuda_device is None:
        return None, "off: no CUDA device in this process"
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception as exc:
        return None, f"off: NVML unavailable ({exc})"
    try:
        handle, index = _handle_of(nvml, cuda_device)
        sampler = TelemetrySampler(writer, nvml, handle, index, interval_s)
        sampler.start()
        return sampler, f"on: NVML GPU {index}, every {interval_s} s"
    except Exception as exc:
        return None, f"off: could not find this rank's GPU in NVML ({exc})"


def _handle_of(nvml, cuda_device):
    """The NVML handle of a torch CUDA device. CUDA_VISIBLE_DEVICES renumbers devices, so match by UUID."""
    import torch

    uuid = str(torch.cuda.get_device_properties(cuda_device).uuid)
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except nvml.NVMLError:
        handle = nvml.nvmlDeviceGetHandleByIndex(cuda_device.index or 0)
    return handle, nvml.nvmlDeviceGetIndex(handle)
