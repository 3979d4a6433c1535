"""GPU time of steps and phases from CUDA events, resolved later so the step never waits for the device.

At each span's end two recorded events and the row they belong to are queued. ``poll()`` (called at each
step start, and by the trace writer's thread before each timed flush) writes the rows whose events have
completed, using ``Event.query()``, which never blocks; ``drain()`` at finish synchronises once. Rows of a span
are therefore written a step or two late on GPU, and at most a flush interval after the GPU finished the span
when the training loop has stopped (a hang, the loop's end): the live metrics and ``diag triage`` see them.
"""

from __future__ import annotations

import math
import threading
from collections import deque

HEALTH_VALUES = ("loss", "grad_norm")  # a non-finite one is an event: the CSV keeps only finite numbers


def host_value(value):
    """A step value (loss, gradient norm, fingerprint) for its row without waiting for the device: a number
    as it is; a CPU tensor as its number; a CUDA tensor copied into a pinned host tensor behind the step's
    end event (its row is written once that event completes, so the copy is done by then)."""
    if value is None or not hasattr(value, "detach"):
        return value
    value = value.detach()
    if value.device.type == "cpu":
        return float(value)
    import torch

    host = torch.empty((), dtype=torch.float64, pin_memory=True)
    host.copy_(value.reshape(()), non_blocking=True)
    return host


def resolve_row(writer, table: str, row: tuple) -> tuple:
    """The row with host tensors read as numbers; a NaN or infinite loss or gradient norm is written as a
    ``nonfinite`` event (the first one is what the health analysis looks for) and left empty in the row."""
    if table != "steps":
        return row
    values = {name: float(v) for name, v in row._asdict().items() if hasattr(v, "detach")}
    for name in HEALTH_VALUES:
        value = values.get(name, getattr(row, name))
        if value is not None and not math.isfinite(value):
            writer.event("nonfinite", step=row.step, value_name=name, value=repr(value))
            values[name] = None
    return row._replace(**values) if values else row


class DeviceTimer:
    def __init__(self, writer):
        import torch

        self._torch = torch
        self._writer = writer
        self._queue: deque = deque()
        # two threads poll (training, writer): the queue's head is read then popped, so one at a time
        self._lock = threading.Lock()

    def start(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, start_event, table: str, row: tuple) -> None:
        """Queue ``row`` (a table's ``row_type``, with a ``device_us`` column) until the span's GPU time is known."""
        end_event = self._torch.cuda.Event(enable_timing=True)
        end_event.record()
        self._queue.append((start_event, end_event, table, row))

    def poll(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # the other thread is polling: the training thread never waits for the writer's
        try:
            while self._queue and self._queue[0][1].query():
                self._resolve(self._queue.popleft())
        finally:
            self._lock.release()

    def drain(self) -> None:
        with self._lock:
            while self._queue:
                start_event, end_event, *_ = entry = self._queue.popleft()
                end_event.synchronize()
                self._resolve(entry)

    def _resolve(self, entry) -> None:
        start_event, end_event, table, row = entry
        device_us = round(start_event.elapsed_time(end_event) * 1000, 1)  # ms -> us
        self._writer.append(table, resolve_row(self._writer, table, row._replace(device_us=device_us)))


class NoDeviceTimer:
    """CPU runs: spans are written at once with an empty device time."""

    def __init__(self, writer):
        self._writer = writer

    def start(self):
        return None

    def stop(self, _start_event, table: str, row: tuple) -> None:
        self._writer.append(table, resolve_row(self._writer, table, row))

    def poll(self) -> None:
        pass

    def drain(self) -> None:
        pass
