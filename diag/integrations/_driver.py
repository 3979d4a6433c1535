"""What the framework callbacks share: a diag session driven by events that arrive as separate calls.

A framework tells a callback "a step begins", "backward begins", "the optimizer step ends" in separate calls,
so nothing here can be a ``with`` block. ``StepDriver`` keeps the open step and the open phase between those
calls and turns them into the session's ``begin_step``/``end_step`` and phase times. Every public method
is guarded: a failure inside diag is one warning, and the framework's training goes on (a project rule).
"""

from __future__ import annotations

import contextlib
import functools
import time

from diag._warn import warn_once
from diag.capture import api


def guarded(method):
    """A callback must never raise into the framework's training loop."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            warn_once(f"integration-{method.__name__}", f"{method.__name__} failed ({exc!r}); capture degrades")
            return None

    return wrapper


def missing_framework(framework: str, extra: str) -> ImportError:
    return ImportError(
        f"diag's {framework} integration needs {framework}: pip install 'diag[{extra}]' "
        f"(from diag's checkout: pip install '.[{extra}]')"
    )


class StepDriver:
    """One callback's view of the session: whether it opened it, the open step, the open phase."""

    def __init__(self, trace_dir, init_options: dict):
        self.trace_dir = trace_dir
        self.init_options = dict(init_options)
        self.owns_session = False
        self.step_open = False
        self._samples = 0
        self._tokens = 0
        self._phase: str | None = None
        self._phase_start_ns = 0
        self._data_wait_start_ns: int | None = None
        self._handles: list = []

    @property
    def session(self):
        return api.current()

    def start(self) -> None:
        """``diag.init`` unless a session is already running (the user's own ``diag.init``, which the user
        then also finishes). Unknown options raise ``TypeError`` here, before training starts; any other
        failure is one warning and capture stays off."""
        if self.session.enabled:
            return
        api.init(self.trace_dir, **self.init_options)
        self.owns_session = self.session.enabled

    # -- steps --------------------------------------------------------------------------------------------
    @guarded
    def begin_step(self, index: int | None) -> None:
        if self.step_open:
            return
        self.data_wait_end()
        self.session.begin_step(index)
        self.step_open = self.session.enabled
        self._samples = self._tokens = 0

    @guarded
    def end_step(self, error: BaseException | None = None) -> None:
        if not self.step_open:
            return
        self.end_phase()
        self.step_open = False
        self.session.end_step(samples=self._samples or None, tokens=self._tokens or None, error=error)

    @guarded
    def count_batch(self, batch=None, samples: int | None = None, tokens: int | None = None) -> None:
        """Add one micro-batch's samples (its leading dimension) and tokens to the open step."""
        if not self.step_open:
            return
        self._samples += samples if samples is not None else batch_size(batch)
        self._tokens += tokens or 0

    # -- phases: forward, backward, optimizer, as step columns ----------------------------------------------
    @guarded
    def begin_phase(self, name: str) -> None:
        """Start timing ``name`` (ending the phase before it); the watchdog sees it as the current phase."""
        if not self.step_open:
            return
        self.end_phase()
        self._phase, self._phase_start_ns = name, time.perf_counter_ns()
        self.session.set_phase(name)

    @guarded
    def end_phase(self, name: str | None = None) -> None:
        """End the open phase (only if it is ``name``, when given) and add its time to the step."""
        if self._phase is None or (name is not None and name != self._phase):
            return
        phase, self._phase = self._phase, None
        self.session.set_phase(None)
        if self.step_open:
            self.session.add_phase_time(phase, (time.perf_counter_ns() - self._phase_start_ns) / 1000)

    def drop_phase(self, name: str) -> None:
        """Forget the open phase without recording it (a forward that never reached a backward)."""
        if self._phase == name:
            self._phase = None
            if self.session.enabled:
                self.session.set_phase(None)

    # -- data wait: time the training thread spends fetching the next batch ----------------------------------
    @guarded
    def data_wait_begin(self, mark_phase: bool = True) -> None:
        """Start (or restart) the wait; ``mark_phase``: show it to the watchdog as the current phase."""
        if self.session.enabled:
            self._data_wait_start_ns = time.perf_counter_ns()
            if mark_phase:
                self.session.set_phase("data_wait")

    @guarded
    def data_wait_end(self) -> None:
        """Add the wait to the session; it becomes the ``data_wait_us`` of the step that begins next."""
        if self._data_wait_start_ns is None:
            return
        start_ns, self._data_wait_start_ns = self._data_wait_start_ns, None
        if self.session.enabled:
            self.session.set_phase(None)
            self.session.add_data_wait((time.perf_counter_ns() - start_ns) / 1000)

    # -- hooks of our own, removed at the end ----------------------------------------------------------------
    def keep_handle(self, handle) -> None:
        self._handles.append(handle)

    @guarded
    def finish(self, error: BaseException | None = None) -> None:
        """Close an open step (with the exception that ended training, if any), remove our hooks, and
        ``diag.finish`` the session if this callback opened it."""
        self.end_step(error)
        self._data_wait_start_ns = None
        for handle in self._handles:
            with contextlib.suppress(Exception):  # a model or optimizer already gone
                handle.remove()
        self._handles.clear()
        if self.owns_session:
            self.owns_session = False
            api.finish()


def batch_size(batch) -> int:
    """The leading dimension of a batch's first tensor: a tensor, a tuple/list, a dict (first value)."""
    import torch

    for _ in range(4):  # nested containers, a few levels deep
        if isinstance(batch, (tuple, list)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            break
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() else 0
