"""The capture components' one lifecycle: start, step begin and end, phase begin and end, stop.

A component (NVTX ranges, memory, collectives, GPU telemetry, the hang watchdog, the calibration, the deep memory
mode) is one module: a class deriving from ``Component`` that overrides the hooks it needs, and a
``start_<name>(session)`` function that builds and starts it from ``session.config``, says in
``session.capture_status`` whether it is on, and returns it, or None when it is off. Its line in ``COMPONENTS``
(diag/capture/session.py) names the session's attribute that holds it and, by its place, when its hooks run.
"""

from __future__ import annotations

from diag._warn import warn_once


class Component:
    """What the session calls on each component that is on. Every hook does nothing: a component overrides those
    it needs, and the base class is the null object. A hook that no component overrides is never called (``hooks_of``)."""

    def step_begin(self, step: int) -> None:
        """The step began: its start is taken, so what this does is in the step's time."""

    def step_end(self, step: int, completed: bool) -> None:
        """The user's step ended (``completed``: it did not raise), before diag takes its time and writes its row."""

    def step_recorded(self, step: int, completed: bool) -> None:
        """The step's row is taken and the step closed: the session is between steps."""

    def phase_begin(self, name: str) -> None:
        """A phase began (``diag.phase`` or the hooks: forward, backward, optimizer, data_wait)."""

    def phase_end(self, name: str) -> None:
        """The phase ``name`` ended."""

    def stop(self) -> None:
        """``diag.finish``: after the device's pending timings are written, before the manifest and the last flush."""


HOOKS = ("step_begin", "step_end", "step_recorded", "phase_begin", "phase_end", "stop")
END_HOOKS = ("step_end", "phase_end", "stop")  # in reverse order: the component begun last ends first
_FAILED = {
    "step_begin": "step timing failed",
    "step_end": "step recording failed",
    "step_recorded": "step recording failed",
    "phase_begin": "phase recording failed",
    "phase_end": "phase recording failed",
    "stop": "error while finishing capture",
}


def hooks_of(components: list[tuple[str, Component]], hook: str) -> tuple:
    """``hook`` of each component that overrides it, guarded, in the order the session calls them. A hook that no
    component overrides is an empty tuple: the session's loop over it costs no more than an ``is None`` test."""
    chosen = [
        _guarded(name, hook, getattr(c, hook))
        for name, c in components
        if getattr(type(c), hook) is not getattr(Component, hook)
    ]
    return tuple(reversed(chosen) if hook in END_HOOKS else chosen)


def _guarded(name: str, hook: str, method):
    """``method``, of which a failure is one warning: the other components' hooks still run, and training goes on."""
    key, what = f"{hook}-{name}", f"{name}: {_FAILED[hook]}"

    def call(*args) -> None:
        try:
            method(*args)
        except Exception as exc:
            warn_once(key, f"{what} ({exc!r})")

    return call
