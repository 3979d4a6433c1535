"""megatron-core pipeline schedules: one ``microbatches`` row per stage forward/backward and per p2p wait, with
no edits to the user's model, as for ``torch.distributed.pipelining`` (diag/capture/pipeline.py).

``diag.instrument(megatron.core.pipeline_parallel.schedules)`` (the module, or the function
``get_forward_backward_func()`` returns) replaces, process-wide and reversibly:

* ``schedules.forward_step`` and ``schedules.backward_step``, the module functions every megatron schedule
  calls for one micro-batch (looked up as module globals at each call, so the schedules see the wrappers);
* the blocking methods of ``P2PCommunicator`` (recv_forward, send_forward_recv_backward, ...): megatron makes a
  communicator inside each schedule call, so its class methods are wrapped. A method that receives is a
  ``recv_wait``, one that only sends a ``send_wait``.

The micro-batch of a forward is megatron's ``current_microbatch``; a backward has none, so it is counted: the
non-interleaved schedule runs backwards first in, first out (1F1B), and the count restarts with each diag step. Waits take the micro-batch of the compute they feed. The interleaved schedule's forwards carry their
model chunk (``vp_stage``); its backwards and waits are recorded on chunk 0 (their chunk is not passed to
``backward_step``), so its per-chunk bubble is approximate. The pipeline layout (stages, micro-batches,
schedule) is read from megatron's ``parallel_state`` at the first forward.
"""

from __future__ import annotations

import functools
import sys
from contextlib import suppress

from diag._warn import warn_once
from diag.capture import pipeline

SCHEDULES_MODULE = "megatron.core.pipeline_parallel.schedules"
P2P_MODULE = "megatron.core.pipeline_parallel.p2p_communication"
# P2PCommunicator's blocking methods: the action they wait for and which micro-batch counter they feed
_P2P_METHODS = {
    "recv_forward": ("recv_wait", "forward"),
    "recv_backward": ("recv_wait", "backward"),
    "send_forward": ("send_wait", "forward_done"),
    "send_backward": ("send_wait", "backward_done"),
    "send_forward_recv_backward": ("recv_wait", "backward"),
    "send_backward_recv_forward": ("recv_wait", "forward"),
    "send_forward_recv_forward": ("recv_wait", "forward"),
    "send_backward_recv_backward": ("recv_wait", "backward"),
    "send_forward_backward_recv_forward_backward": ("recv_wait", "forward"),
}


def is_megatron_schedules(obj) -> bool:
    name = getattr(obj, "__name__", None) if type(obj).__name__ == "module" else getattr(obj, "__module__", None)
    return name == SCHEDULES_MODULE and SCHEDULES_MODULE in sys.modules


def instrument(session, _obj) -> MegatronHooks | None:
    if any(isinstance(h, MegatronHooks) for h in session._hooks):
        warn_once("megatron-twice", "megatron-core's schedules are already instrumented; ignored")
        return None
    return MegatronHooks(session)


class MegatronHooks:
    def __init__(self, session):
        self.session = session
        self.recorder = pipeline._Recorder(session)
        self.schedules = sys.modules[SCHEDULES_MODULE]
        self._restore: list[tuple[object, str, object]] = []
        self._forward_mb = -1  # micro-batch of the forward in progress / last started in this step
        self._backward_mb = 0  # micro-batches whose backward has started in this step
        self._step = None  # the diag step the counters belong to
        self._vp_stage = 0
        self._layout_written = False
        self._wrap(self.schedules, "forward_step", self._timed_forward)
        self._wrap(self.schedules, "backward_step", self._timed_backward)
        p2p = sys.modules.get(P2P_MODULE)
        communicator = getattr(p2p, "P2PCommunicator", None)
        if communicator is None:
            warn_once("megatron-p2p", "megatron-core has no P2PCommunicator here; pipeline waits are not timed")
        else:
            for name, (action, feeds) in _P2P_METHODS.items():
                if hasattr(communicator, name):
                    self._wrap(communicator, name, functools.partial(self._timed_wait, action, feeds))

    def _wrap(self, owner, name: str, make) -> None:
        original = getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def remove(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    # -- compute ------------------------------------------------------------------------------------------
    def _timed_forward(self, original):
        def forward_step(*args, **kwargs):
            self._new_step_resets()
            started = self._begin()
            microbatch = kwargs.get("current_microbatch")
            if microbatch is not None:
                self._forward_mb = int(microbatch)
            self._vp_stage = int(kwargs.get("vp_stage") or 0)
            if not self._layout_written:
                self._write_layout(args[3] if len(args) > 3 else kwargs.get("num_microbatches"))
            try:
                return original(*args, **kwargs)
            finally:
                self._end(started, "forward", self._forward_mb, self._vp_stage)

        return forward_step

    def _timed_backward(self, original):
        def backward_step(*args, **kwargs):
            self._new_step_resets()
            started = self._begin()
            microbatch = self._backward_mb
            self._backward_mb += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._end(started, "backward", microbatch, 0)

        return backward_step

    # -- waits --------------------------------------------------------------------------------------------
    def _timed_wait(self, action: str, feeds: str, original):
        def wait(*args, **kwargs):
            self._new_step_resets()
            started = self._begin()
            try:
                return original(*args, **kwargs)
            finally:
                self._end(started, action, self._wait_microbatch(feeds), self._vp_stage)

        return wait

    def _new_step_resets(self) -> None:
        """A wait before the step's first forward (stage > 0 receives micro-batch 0) belongs to the new step."""
        step = self.session.current_step_or_none()
        if step != self._step:
            self._step, self._forward_mb, self._backward_mb = step, -1, 0

    def _wait_microbatch(self, feeds: str) -> int:
        if feeds == "forward":  # the input of the next forward
            return self._forward_mb + 1
        if feeds == "backward":  # the gradient for the next backward
            return self._backward_mb
        if feeds == "forward_done":
            return self._forward_mb
        return max(self._backward_mb - 1, 0)

    # -- rows ---------------------------------------------------------------------------------------------
    def _begin(self):
        return pipeline._safe_begin(self)

    def _end(self, started, action: str, microbatch: int, chunk: int) -> None:
        if started is None:
            return
        try:
            stage = self._stage()
            virtual = stage + chunk * self._stages() if chunk else stage
            self.recorder.end(started, self.session.current_step_or_none(), stage, virtual, microbatch, action)
        except Exception as exc:
            warn_once("megatron-row", f"megatron pipeline timing failed ({exc!r}); some micro-batch rows are missing")

    def _stage(self) -> int:
        state = sys.modules.get("megatron.core.parallel_state")
        try:
            return int(state.get_pipeline_model_parallel_rank())
        except Exception:
            return int(self.session.rank)

    def _stages(self) -> int:
        state = sys.modules.get("megatron.core.parallel_state")
        try:
            return int(state.get_pipeline_model_parallel_world_size())
        except Exception:
            return 1

    def _write_layout(self, num_microbatches) -> None:
        self._layout_written = True
        state = sys.modules.get("megatron.core.parallel_state")
        virtual = None
        with suppress(Exception):  # an older megatron-core, or parallel_state not initialised
            virtual = state.get_virtual_pipeline_model_parallel_world_size()
        chunks = int(virtual or 1)
        schedule = "megatron-interleaved-1F1B" if chunks > 1 else "megatron-1F1B"
        if num_microbatches is None:
            warn_once("megatron-layout", "megatron-core did not pass num_microbatches; no pipeline layout")
            return
        pipeline.pipeline_layout(self.session, schedule, self._stages(), int(num_microbatches), chunks, self._stage())
