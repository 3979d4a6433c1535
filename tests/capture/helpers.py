"""A stand-in for pynvml that replays NVML readings recorded on an H100 (a machine without an NVIDIA GPU
cannot run NVML), shared by the capture and Prometheus tests."""

import json
import types


def read_nvml_fixture(gpu_fixtures):
    lines = [json.loads(line) for line in (gpu_fixtures / "nvml_samples_h100.jsonl").read_text().splitlines()]
    return lines[0]["static"], lines[1:]


class ReplayNvml:
    """Stands in for pynvml: answers each query from the recorded H100 readings, in order."""

    class NVMLError(Exception):
        pass

    # pynvml's values of the constants diag passes
    NVML_TEMPERATURE_GPU = NVML_PCIE_UTIL_TX_BYTES = NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_VOLATILE_ECC = 0
    NVML_CLOCK_SM = NVML_PCIE_UTIL_RX_BYTES = NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1

    def __init__(self, samples, fail_after: int | None = None):
        self.samples = samples
        self.index = 0
        self.fail_after = fail_after

    def _current(self, key):
        if self.fail_after is not None and self.index >= self.fail_after:
            raise RuntimeError("GPU has fallen off the bus")
        return self.samples[self.index % len(self.samples)][key]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=self._current("util_gpu"), memory=self._current("util_mem"))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=self._current("mem_used"), total=self._current("mem_total"))

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._current("power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._current("power_limit_mw")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._current("temp_c")

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._current("sm_clock_mhz")

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return self._current("sm_clock_max_mhz")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._current("clock_event_reasons")

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        return self._current("pcie_tx_kbs" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbs")

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        value = self._current("ecc_corrected_volatile" if kind == 0 else "ecc_uncorrected_volatile")
        if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            self.index += 1  # the last query of a reading: move on to the next recorded sample
        return value

    def nvmlEventSetCreate(self):
        raise self.NVMLError("not supported")
