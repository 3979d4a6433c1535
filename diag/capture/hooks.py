"""Forward, backward and optimizer timing through hooks, with no edits to the user's modules.

* forward: forward pre-hook and hook of the outermost instrumented module (nested calls are not recounted);
* backward: starts when the gradient of the model's output arrives (a tensor hook on the outputs) and ends
  when autograd finishes. The end is marked by a callback queued on the autograd engine that queues a
  second one, so it runs after DDP's own end-of-backward callback (which waits for the gradient buckets);
* optimizer: the optimizer's step pre- and post-hooks.
"""

from __future__ import annotations

import time

from diag._warn import warn_once


def _guarded(method):
    """A hook must never raise into the user's forward, backward or optimizer step."""

    def guarded(self, *args):
        try:
            return method(self, *args)
        except Exception as exc:
            warn_once(f"hook-{method.__name__}", f"{method.__name__} failed ({exc!r}); its timing is missing")
            return None

    guarded.__name__ = method.__name__
    return guarded


def _output_tensors(output):
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]


class ModelHooks:
    def __init__(self, session, module):
        self.session = session
        self.module = module
        self._forward_start_ns: int | None = None
        self._backward_start_ns: int | None = None
        self.handles = [
            module.register_forward_pre_hook(self._before_forward),
            module.register_forward_hook(self._after_forward),
        ]

    @_guarded
    def _before_forward(self, _module, _inputs):
        if self._forward_start_ns is None:
            self._forward_start_ns = time.perf_counter_ns()
            self.session.set_phase("forward")

    @_guarded
    def _after_forward(self, _module, _inputs, output):
        end_ns = time.perf_counter_ns()
        tensors = _output_tensors(output)
        if tensors:
            tensors[0].register_hook(self._on_output_grad)
        if self._forward_start_ns is not None:
            start_ns, self._forward_start_ns = self._forward_start_ns, None
            self.session.set_phase(None)
            self.session.add_phase_time("forward", (end_ns - start_ns) / 1000)

    @_guarded
    def _on_output_grad(self, _grad):
        import torch

        self._backward_start_ns = time.perf_counter_ns()
        self.session.set_phase("backward")
        engine = torch.autograd.Variable._execution_engine
        engine.queue_callback(lambda: engine.queue_callback(self._after_backward))

    @_guarded
    def _after_backward(self):
        if self._backward_start_ns is not None:
            self.session.add_phase_time("backward", (time.perf_counter_ns() - self._backward_start_ns) / 1000)
            self._backward_start_ns = None
            self.session.set_phase(None)

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
