"""diag's steps and phases as NVTX ranges, so an Nsight Systems (``nsys``) timeline shows them beside the
kernels (``diag.init(nvtx=True)``).

Start/end ranges (``nvtxRangeStartA``/``nvtxRangeEnd``), not push/pop: push/pop ranges belong to the thread
that pushed them, and on a GPU the backward phase starts on the training thread and ends on autograd's device
thread. A start/end range may end on any thread.

Off (the default) it is not started: step and phase boundaries have no NVTX hook to call. On a build without
CUDA's NVTX (torch's CPU wheels) the option turns itself off with one warning.
"""

from __future__ import annotations

from diag._warn import warn_once
from diag.capture.components import Component

RANGE_PREFIX = "diag."


class NvtxRanges(Component):
    """Open ranges by key (``"step"``, ``"phase:forward"``): opening a key that is open ends its range first,
    and the session ends every open range at each step's end, so a missed end (a step that raised inside a
    phase) never leaves a range open for the rest of the run."""

    def __init__(self, nvtx_api):
        self._api = nvtx_api
        self._open: dict[str, int] = {}

    def open(self, key: str, name: str) -> None:
        try:
            self.close(key)
            self._open[key] = self._api.range_start(RANGE_PREFIX + name)
        except Exception as exc:
            self._fail(exc)

    def close(self, key: str) -> None:
        range_id = self._open.pop(key, None)
        if range_id is None:
            return
        try:
            self._api.range_end(range_id)
        except Exception as exc:
            self._fail(exc)

    def close_all(self) -> None:
        for key in list(self._open):
            self.close(key)

    def step_begin(self, step: int) -> None:
        self.open("step", f"step {step}")

    def phase_begin(self, name: str) -> None:
        self.open(f"phase:{name}", name)

    def phase_end(self, name: str) -> None:
        self.close(f"phase:{name}")

    def step_recorded(self, step: int, completed: bool) -> None:
        self.close_all()

    def stop(self) -> None:
        self.close_all()

    def _fail(self, exc: Exception) -> None:
        warn_once("nvtx", f"NVTX ranges failed ({exc!r}); diag stops emitting them")
        self._api = _NoNvtx()
        self._open = {}


class _NoNvtx:
    def range_start(self, _message: str) -> int:
        return 0

    def range_end(self, _range_id: int) -> None:
        pass


def start_nvtx(session) -> NvtxRanges | None:
    """The ranges, or None when off or when this torch has no NVTX (one warning, then the job goes on)."""
    enabled, ranges = session.config.nvtx, None
    if enabled:
        try:
            import torch.cuda.nvtx as nvtx_api

            nvtx_api.range_end(nvtx_api.range_start(RANGE_PREFIX + "init"))  # fails at once without NVTX
            ranges = NvtxRanges(nvtx_api)
        except Exception as exc:
            warn_once("nvtx", f"nvtx=True but NVTX is not available in this torch build ({exc!r}); no ranges")
    session.capture_status["nvtx"] = "on" if ranges else "off: this torch has no NVTX" if enabled else "off"
    return ranges
