"""GPU telemetry from NVML (nvidia-ml-py), sampled by a background thread for the rank's own GPU.

Reading (``read_sample``) is kept apart from decoding (``decode_sample``): the raw readings have NVML's units
(mW, KB/s, bitmasks) and the same keys as the recorded fixtures, so decoding is testable without a GPU.
"""

from __future__ import annotations

import logging
import threading
import time

from diag._warn import warn_once
from diag.trace.schema import TELEMETRY

log = logging.getLogger("diag")

_MAX_CONSECUTIVE_FAILURES = 5


def read_sample(nvml, handle) -> dict:
    """One reading of every metric; a metric the GPU does not support reads as None."""

    def query(function, *args):
        try:
            return function(handle, *args)
        except nvml.NVMLError:
            return None

    utilisation = query(nvml.nvmlDeviceGetUtilizationRates)
    memory = query(nvml.nvmlDeviceGetMemoryInfo)
    reasons_function = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return {
        "t_ns": time.time_ns(),
        "util_gpu": getattr(utilisation, "gpu", None),
        "util_mem": getattr(utilisation, "memory", None),
        "mem_used": getattr(memory, "used", None),
        "mem_total": getattr(memory, "total", None),
        "power_mw": query(nvml.nvmlDeviceGetPowerUsage),
        "power_limit_mw": query(nvml.nvmlDeviceGetEnforcedPowerLimit),
        "temp_c": query(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": query(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": query(nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM),
        "clock_event_reasons": query(reasons_function),
        "pcie_tx_kbs": query(nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx_kbs": query(nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_RX_BYTES),
        "ecc_corrected_volatile": query(
            nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "ecc_uncorrected_volatile": query(
            nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
    }


def _scaled(value, factor: float):
    return None if value is None else round(value * factor, 3)


def decode_sample(sample: dict, gpu_index: int, xid: int | None = None) -> tuple:
    """A raw reading as a ``telemetry`` row (schema units: W, MHz, bytes, KB/s)."""
    return TELEMETRY.row(
        time_us=sample["t_ns"] // 1000,
        gpu=gpu_index,
        util_pct=sample.get("util_gpu"),
        mem_util_pct=sample.get("util_mem"),
        mem_used_bytes=sample.get("mem_used"),
        mem_total_bytes=sample.get("mem_total"),
        power_w=_scaled(sample.get("power_mw"), 1e-3),
        power_limit_w=_scaled(sample.get("power_limit_mw"), 1e-3),
        temp_c=sample.get("temp_c"),
        sm_clock_mhz=sample.get("sm_clock_mhz"),
        sm_clock_max_mhz=sample.get("sm_clock_max_mhz"),
        throttle_reasons=sample.get("clock_event_reasons"),
        pcie_tx_kib_per_s=sample.get("pcie_tx_kbs"),
        pcie_rx_kib_per_s=sample.get("pcie_rx_kbs"),
        ecc_corrected=sample.get("ecc_corrected_volatile"),
        ecc_uncorrected=sample.get("ecc_uncorrected_volatile"),
        xid=xid,
    )


class TelemetrySampler:
    """Samples one GPU every ``interval_s`` on a daemon thread; stops with one warning if NVML fails."""

    def __init__(self, writer, nvml, handle, gpu_index: int, interval_s: float):
        self.writer = writer
        self.nvml = nvml
        self.handle = handle
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diag-nvml", daemon=True)
        self._xid_events = self._register_xid_events()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _register_xid_events(self):
        try:
            event_set = self.nvml.nvmlEventSetCreate()
            self.nvml.nvmlDeviceRegisterEvents(self.handle, self.nvml.nvmlEventTypeXidCriticalError, event_set)
            return event_set
        except Exception:  # not supported on every GPU or driver: XIDs then stay unreported
            return None

    def _poll_xid(self) -> int | None:
        if self._xid_events is None:
            return None
        try:
            return int(self.nvml.nvmlEventSetWait_v2(self._xid_events, 0).eventData)
        except Exception:  # NVMLError_Timeout: no event since the last poll
            return None

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                sample = read_sample(self.nvml, self.handle)
                self.writer.append("telemetry", decode_sample(sample, self.gpu_index, self._poll_xid()))
                failures = 0
            except Exception as exc:
                failures += 1
                if failures >= _MAX_CONSECUTIVE_FAILURES:
                    warn_once("nvml-failed", f"NVML keeps failing ({exc!r}); GPU telemetry stopped")
                    return
            self._stop.wait(self.interval_s)


def start_telemetry(writer, cuda_device, interval_s: float) -> tuple[TelemetrySampler | None, str]:
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
