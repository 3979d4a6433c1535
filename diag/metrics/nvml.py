"""NVML, read without torch: one module for every reader of GPU telemetry (capture's per-rank sampler in
``diag.capture.nvml`` and the node agent ``diag telemetry``).

Reading (``read_sample``) is kept apart from decoding (``decode_sample``): the raw readings have NVML's units
(mW, KB/s, bitmasks) and the same keys as the recorded fixtures, so decoding is testable without a GPU. XID
errors arrive as NVML events; ``XidEvents`` drains them for any set of GPUs and hands them out one per sample.
"""

from __future__ import annotations

import time
from collections import deque

from diag.trace.schema import TELEMETRY

MAX_XID_EVENTS_PER_POLL = 64  # drained per poll; more wait for the next one (an XID storm must not stall sampling)


def open_nvml():
    """(pynvml module, None) once NVML is initialised, or (None, why not) where there is no NVIDIA GPU/driver."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        if nvml.nvmlDeviceGetCount() == 0:
            return None, "NVML sees no GPU on this node"
        return nvml, None
    except Exception as exc:
        return None, f"NVML unavailable ({exc})"


def read_sample(nvml, handle) -> dict:
    """One reading of every metric; a metric the GPU does not support reads as None."""

    def query(function, *args):
        try:
            return function(handle, *args)
        except nvml.NVMLError:
            return None

    utilisation = query(nvml.nvmlDeviceGetUtilizationRates)
    memory = query(nvml.nvmlDeviceGetMemoryInfo)
    processes_function = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None)
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
        "processes": _processes(query(processes_function)) if processes_function is not None else None,
    }


def read_clocks(nvml, handle) -> dict:
    """The GPU's speed right now, for a calibration row: SM clock and its maximum (MHz), performance state (0
    fastest) and clock-event reasons; a value the GPU does not give is None."""

    def query(function, *args):
        try:
            return function(handle, *args)
        except nvml.NVMLError:
            return None

    reasons_function = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return {
        "sm_clock_mhz": query(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": query(nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM),
        "pstate": query(nvml.nvmlDeviceGetPerformanceState),
        "throttle_reasons": query(reasons_function),
    }


def _processes(infos) -> list[list] | None:
    """NVML's compute processes as [pid, used bytes] (None where NVML cannot say: MIG, WDDM, no permission)."""
    if infos is None:
        return None
    return [[int(p.pid), getattr(p, "usedGpuMemory", None)] for p in infos]


def _scaled(value, factor: float):
    return None if value is None else round(value * factor, 3)


def process_memory(processes: list | None, pid: int | None) -> tuple[int | None, int | None]:
    """(bytes ``pid`` uses, bytes the other processes use) on a GPU, from NVML's compute processes. Unknown
    (None) where NVML listed nothing, where it did not say any other process's memory, and for ``pid`` where
    it is not listed (a container's pid namespace hides the host pid NVML reports)."""
    if not isinstance(processes, list):
        return None, None
    own, others, others_known, others_seen = None, 0, False, False
    for entry in processes:
        if not (isinstance(entry, list | tuple) and len(entry) == 2):
            continue
        used = entry[1] if isinstance(entry[1], int) and not isinstance(entry[1], bool) and entry[1] >= 0 else None
        if pid is not None and entry[0] == pid:
            own = None if used is None else (own or 0) + used
        else:
            others_seen = True
            if used is not None:
                others, others_known = others + used, True
    return own, others if others_known or not others_seen else None


def decode_sample(sample: dict, gpu_index: int, xid: int | None = None, pid: int | None = None) -> tuple:
    """A raw reading as a ``telemetry`` row (schema units: W, MHz, bytes, KB/s). ``pid``: the rank's process,
    whose GPU memory is told apart from the other processes' (the node agent gives none: all are others)."""
    own, others = process_memory(sample.get("processes"), pid)
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
        process_mem_used_bytes=own,
        other_processes_mem_used_bytes=others,
    )


class XidEvents:
    """XID critical errors of some GPUs (by NVML index), from one NVML event set. A telemetry row has one
    ``xid`` cell, so each sample takes the oldest unreported XID of its GPU; several in one interval are
    reported by the following samples, none is lost."""

    def __init__(self, nvml, handles: dict[int, object]):
        self.nvml = nvml
        self._pending: dict[int, deque[int]] = {index: deque() for index in handles}
        self._event_set = self._register(handles)

    def _register(self, handles: dict[int, object]):
        try:
            event_set = self.nvml.nvmlEventSetCreate()
            for handle in handles.values():
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, event_set)
            return event_set
        except Exception:  # not supported on every GPU or driver: XIDs then stay unreported
            return None

    def poll(self) -> None:
        """Move the events NVML holds (at most MAX_XID_EVENTS_PER_POLL) to their GPUs' queues; never waits."""
        if self._event_set is None:
            return
        for _ in range(MAX_XID_EVENTS_PER_POLL):
            try:
                event = self.nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:  # NVMLError_Timeout: no more events
                return
            try:
                index = int(self.nvml.nvmlDeviceGetIndex(event.device))
            except Exception:
                index = next(iter(self._pending), -1) if len(self._pending) == 1 else -1  # one GPU: it is its
            self._pending.setdefault(index, deque()).append(int(event.eventData))

    def next_for(self, index: int) -> int | None:
        """The oldest XID of GPU ``index`` not yet reported, else None."""
        pending = self._pending.get(index)
        return pending.popleft() if pending else None
