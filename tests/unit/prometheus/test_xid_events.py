"""XID errors reach the telemetry rows one per sample, whichever reader drains them (a rank's sampler or the
node agent), and none is lost when several arrive between two samples.

NVML's event API is replaced by a stand-in: this machine has no NVIDIA driver, and an XID cannot be raised on
purpose on a real GPU. The stand-in follows pynvml's calls (nvmlEventSetCreate, nvmlDeviceRegisterEvents,
nvmlEventSetWait_v2 raising on timeout, nvmlDeviceGetIndex of the event's device)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from diag.metrics.nvml import MAX_XID_EVENTS_PER_POLL, XidEvents


class NvmlTimeout(Exception):
    pass


class EventNvml:
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.queue: deque = deque()
        self.registered: list = []

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, kind, event_set):
        self.registered.append((handle, kind))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.queue:
            raise NvmlTimeout("NVML_ERROR_TIMEOUT")
        return self.queue.popleft()

    def nvmlDeviceGetIndex(self, handle):
        return int(handle.removeprefix("gpu"))

    def raise_xid(self, gpu: int, xid: int) -> None:
        self.queue.append(SimpleNamespace(device=f"gpu{gpu}", eventData=xid))


def test_several_xids_between_samples_are_reported_by_the_following_samples():
    nvml = EventNvml()
    xids = XidEvents(nvml, {0: "gpu0", 1: "gpu1"})
    assert [h for h, _ in nvml.registered] == ["gpu0", "gpu1"]
    for gpu, xid in ((0, 79), (1, 48), (0, 63), (0, 94)):
        nvml.raise_xid(gpu, xid)
    reported = {0: [], 1: []}
    for _sample in range(4):
        xids.poll()
        for gpu in (0, 1):
            reported[gpu].append(xids.next_for(gpu))
    assert reported == {0: [79, 63, 94, None], 1: [48, None, None, None]}


def test_an_xid_storm_is_drained_a_bounded_number_at_a_time():
    nvml = EventNvml()
    xids = XidEvents(nvml, {0: "gpu0"})
    for _ in range(MAX_XID_EVENTS_PER_POLL + 10):
        nvml.raise_xid(0, 13)
    xids.poll()
    assert len(nvml.queue) == 10  # left for the next poll: sampling is never held up by the storm


def test_without_event_support_no_xid_is_reported_and_nothing_raises():
    class NoEvents(EventNvml):
        def nvmlEventSetCreate(self):
            raise NvmlTimeout("NVML_ERROR_NOT_SUPPORTED")

    xids = XidEvents(NoEvents(), {0: "gpu0"})
    xids.poll()
    assert xids.next_for(0) is None
