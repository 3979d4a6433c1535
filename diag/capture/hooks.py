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

    def _before_forward(self, _module, _inputs):
        if self._forward_start_ns is None:
            self._forward_start_ns = time.perf_counter_ns()
            self.session.set_phase("forward")

    def _after_forward(self, _module, _inputs, output):
        try:
            if self._forward_start_ns is not None:
                self.session.add_phase_time("forward", (time.perf_counter_ns() - self._forward_start_ns) / 1000)
                self._forward_start_ns = None
                self.session.set_phase(None)
            tensors = _output_tensors(output)
            if tensors:
                tensors[0].register_hook(self._on_output_grad)
        except Exception as exc:
            warn_once("forward-hook", f"forward timing failed ({exc!r}); forward/backward times may be missing")
        return None

    def _on_output_grad(self, grad):
        try:
            import torch

            self._backward_start_ns = time.perf_counter_ns()
            self.session.set_phase("backward")
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self._after_backward))
        except Exception as exc:
            warn_once("backward-hook", f"backward timing failed ({exc!r})")
        return None

    def _after_backward(self):
        try:
            if self._backward_start_ns is not None:
                self.session.add_phase_time("backward", (time.perf_counter_ns() - self._backward_start_ns) / 1000)
                self._backward_start_ns = None
                self.session.set_phase(None)
        except Exception as exc:
            warn_once("backward-hook", f"backward timing failed ({exc!r})")

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

    def _before_step(self, _optimizer, _args, _kwargs):
        self._start_ns = time.perf_counter_ns()
        self.session.set_phase("optimizer")

    def _after_step(self, _optimizer, _args, _kwargs):
        if self._start_ns is not None:
            self.session.add_phase_time("optimizer", (time.perf_counter_ns() - self._start_ns) / 1000)
            self._start_ns = None
            self.session.set_phase(None)

    def remove(self):
        for handle in self.handles:
            handle.remove()
