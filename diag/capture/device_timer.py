"""GPU time of steps and phases from CUDA events, resolved later so the step never waits for the device.

At each span's end two recorded events and the row they belong to are queued. ``poll()`` (called at each
step start) writes the rows whose events have completed, using ``Event.query()``, which never blocks;
``drain()`` at finish synchronises once. Rows of a span are therefore written a step or two late on GPU.
"""

from __future__ import annotations

from collections import deque


class DeviceTimer:
    def __init__(self, writer):
        import torch

        self._torch = torch
        self._writer = writer
        self._queue: deque = deque()

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
        while self._queue and self._queue[0][1].query():
            self._resolve(self._queue.popleft())

    def drain(self) -> None:
        while self._queue:
            start_event, end_event, *_ = entry = self._queue.popleft()
            end_event.synchronize()
            self._resolve(entry)

    def _resolve(self, entry) -> None:
        start_event, end_event, table, row = entry
        device_us = round(start_event.elapsed_time(end_event) * 1000, 1)  # ms -> us
        self._writer.append(table, row._replace(device_us=device_us))


class NoDeviceTimer:
    """CPU runs: spans are written at once with an empty device time."""

    def __init__(self, writer):
        self._writer = writer

    def start(self):
        return None

    def stop(self, _start_event, table: str, row: tuple) -> None:
        self._writer.append(table, row)

    def poll(self) -> None:
        pass

    def drain(self) -> None:
        pass
