"""Forward, backward and optimizer timing through hooks, with no edits to the user's modules.

* forward: forward pre-hook and hook of the outermost instrumented module (nested calls are not recounted);
* backward: every ``torch.autograd.backward`` call (``Tensor.backward`` makes one) while a model is
  instrumented, timed by a wrapper around it. The call returns once the engine has run its end-of-backward
  callbacks, DDP's wait for its gradient buckets among them. A tensor hook on the model's output and callbacks
  queued on the engine measured the same and cost ~45 us a step: every call from the engine into Python
  does (docs/benchmarks.md); the wrapper is one Python frame;
* optimizer: the optimizer's step pre- and post-hooks.

Under ``torch.compile`` no hook adds a graph break or a recompilation: a clock read is a builtin dynamo cannot
trace. A hook that dynamo meets as a frame of its own (the hooks of a ``torch.compile(module)``-d module, which
run outside its compiled forward; the backward wrapper called after a graph break) runs eagerly and times as
usual (``torch_private.run_frames_eagerly``). A hook that dynamo inlines into a region it traces (a
``module.compile()``-d module's own hooks, a compiled optimizer step, compiled autograd's hooks) returns at once
on ``torch.compiler.is_compiling()``, which dynamo folds to a constant: that phase is not timed
(docs/frameworks.md, torch.compile).
"""

from __future__ import annotations

import functools
import threading
import time

import torch

from diag._warn import warn_once
from diag.capture import torch_private


def compiling() -> bool:
    """True while dynamo traces the caller into a graph. Dynamo folds it to a constant, so a hook that returns on
    it adds nothing to the graph and no break."""
    return torch.compiler.is_compiling()


def run_eagerly_under_compile(function):
    """Have dynamo run ``function`` eagerly where it meets it as a frame of its own (module docstring); without
    that (an older torch without the API) such a hook returns on ``compiling()`` there and its phase goes untimed."""
    try:
        torch_private.run_frames_eagerly(function.__code__)
    except Exception as exc:
        warn_once(
            "compile-eager-hooks",
            f"cannot keep diag's hooks out of torch.compile's tracing ({exc!r}); under torch.compile the forward "
            "and optimizer phases may go untimed",
        )
    return function


def _guarded(method):
    """A hook must never raise into the user's forward, backward or optimizer step, nor break a compiled graph."""

    def guarded(self, *args):
        if compiling():
            return None
        try:
            return method(self, *args)
        except Exception as exc:
            warn_once(f"hook-{method.__name__}", f"{method.__name__} failed ({exc!r}); its timing is missing")
            return None

    guarded.__name__ = method.__name__
    return guarded


# every guarded hook shares this code object: set once, at import
_run_hooks_eagerly = run_eagerly_under_compile(_guarded(lambda _self: None))


# -- backward passes ------------------------------------------------------------------------------------------
# Listeners have on_backward_start(start_ns) and on_backward_end(start_ns, end_ns) (perf_counter_ns). The
# wrapper is installed once per process and stays; without listeners it only passes the call on.
_backward_listeners: list = []


class _Nesting:
    """Backward calls in progress in any thread. One that starts inside another is the outer one's time: a
    double backward, or reentrant activation checkpointing, which runs its backward on the engine's device
    threads on a GPU (so a per-thread count would miss it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0

    def enter(self) -> bool:
        """True for the outermost call."""
        with self._lock:
            self._running += 1
            return self._running == 1

    def leave(self) -> None:
        with self._lock:
            self._running -= 1


_nesting = _Nesting()


def listen_to_backward(listener) -> None:
    _install_backward_wrapper()
    if listener not in _backward_listeners:
        _backward_listeners.append(listener)


def stop_listening_to_backward(listener) -> None:
    if listener in _backward_listeners:
        _backward_listeners.remove(listener)


def _install_backward_wrapper() -> None:
    original = torch.autograd.backward
    if getattr(original, "__diag_wrapped__", False):
        return

    @functools.wraps(original)
    def backward(*args, **kwargs):
        return run_as_backward(original, *args, **kwargs)

    backward.__diag_wrapped__ = True
    run_eagerly_under_compile(backward)
    torch.autograd.backward = backward


def run_as_backward(original, *args, **kwargs):
    """Call ``original`` as one backward pass for the listeners: ``torch.autograd.backward`` itself, or a
    framework's call that holds it (DeepSpeed's ``engine.backward``, with ZeRO's reduction after autograd).
    A backward started inside another is the outer one's time, not a second pass."""
    listeners = tuple(_backward_listeners)
    if not listeners or compiling():  # traced: dynamo handles torch's own backward as without diag
        return original(*args, **kwargs)
    outermost = _nesting.enter()
    try:
        if not outermost:
            return original(*args, **kwargs)
        start_ns = time.perf_counter_ns()
        _notify(listeners, "on_backward_start", start_ns)
        try:
            return original(*args, **kwargs)
        finally:
            _notify(listeners, "on_backward_end", start_ns, time.perf_counter_ns())
    finally:
        _nesting.leave()


def _notify(listeners, method: str, *args) -> None:
    for listener in listeners:
        try:
            getattr(listener, method)(*args)
        except Exception as exc:  # never into the user's backward
            warn_once(f"backward-{method}", f"{method} failed ({exc!r}); backward timing is missing")


class BackwardHooks:
    """The session's backward phase: one per session, however many models are instrumented."""

    def __init__(self, session):
        self.session = session
        listen_to_backward(self)

    @_guarded
    def on_backward_start(self, _start_ns):
        self.session.set_phase("backward")

    @_guarded
    def on_backward_end(self, start_ns, end_ns):
        self.session.set_phase(None)
        self.session.add_phase_time("backward", (end_ns - start_ns) / 1000)
        self.session.on_backward_end()

    def remove(self):
        stop_listening_to_backward(self)


class ModelHooks:
    def __init__(self, session, module):
        self.session = session
        self.module = module
        self._forward_start_ns: int | None = None
        self.handles = [
            module.register_forward_pre_hook(self._before_forward),
            # always_call: a forward that raised still ends here, or its start would inflate the next forward
            module.register_forward_hook(self._after_forward, always_call=True),
        ]

    @_guarded
    def _before_forward(self, _module, _inputs):
        if self._forward_start_ns is None:
            self._forward_start_ns = time.perf_counter_ns()
            self.session.set_phase("forward")

    @_guarded
    def _after_forward(self, _module, _inputs, _output):
        if self._forward_start_ns is not None:
            start_ns, self._forward_start_ns = self._forward_start_ns, None
            self.session.set_phase(None)
            self.session.add_phase_time("forward", (time.perf_counter_ns() - start_ns) / 1000)

    def remove(self):
        for handle in self.handles:
            handle.remove()


class OptimizerHooks:
    def __init__(self, session, optimizer):
        self.session = session
        self._start_ns: int | None = None
        self.handles = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
        ]

    @_guarded
    def _before_step(self, _optimizer, _args, _kwargs):
        self._start_ns = time.perf_counter_ns()
        self.session.set_phase("optimizer")

    @_guarded
    def _after_step(self, _optimizer, _args, _kwargs):
        if self._start_ns is not None:
            self.session.add_phase_time("optimizer", (time.perf_counter_ns() - self._start_ns) / 1000)
            self._start_ns = None
            self.session.set_phase(None)

    def remove(self):
        for handle in self.handles:
            handle.remove()
