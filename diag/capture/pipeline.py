"""Pipeline parallelism: one ``microbatches`` row per stage action on one micro-batch, and each send/recv wait.

Automatic for ``torch.distributed.pipelining`` schedules (``diag.instrument(schedule)``), with no edits to the
user's stage modules:

* compute: each stage's ``forward_one_chunk``, ``backward_one_chunk`` (``backward``, or ``backward_input`` when
  a zero-bubble schedule splits it) and ``backward_weight_one_chunk`` are wrapped *on the instance*; the
  class and other stages are untouched, and ``remove()`` restores them;
* waits: the schedules wait for their point-to-point transfers in the module function ``_wait_batch_p2p``,
  which no instance owns. ``_batch_p2p`` and ``_wait_batch_p2p`` are replaced once, process-wide, by
  pass-through wrappers: the P2P ops an instrumented stage hands out are tagged (micro-batch, stage), the
  works they produce inherit the tag, and only tagged waits are timed. Untagged calls (schedules diag was not
  asked to instrument) go straight to torch's functions.

A manual API covers other engines (Megatron-style, DeepSpeed, home-grown): ``diag.pipeline_action`` around
each forward/backward/wait, and ``diag.pipeline_layout`` for the manifest's ``pipeline`` key.

Rows carry the step of the enclosing ``diag.step()``; outside one, the schedule's own count of ``step()``
calls (from 0). Everything here is guarded: a failure is one warning and training goes on.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, suppress

from diag._warn import warn_once
from diag.capture import torch_private
from diag.capture.calibration import CORE_WAIT
from diag.trace.schema import MICROBATCHES

COMPUTE_ACTIONS = ("forward", "backward", "backward_input", "backward_weight")
WAIT_ACTIONS = ("send_wait", "recv_wait")
ACTIONS = COMPUTE_ACTIONS + WAIT_ACTIONS
_TAG = "_diag_pipeline_tag"  # attribute set on tagged P2P ops and work lists

_STAGE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
_OP_GETTERS = ("get_fwd_recv_ops", "get_bwd_recv_ops", "get_fwd_send_ops", "get_bwd_send_ops")


class _Recorder:
    """Writes microbatches rows for one session; shared by the automatic hooks and the manual API."""

    def __init__(self, session):
        self.session = session
        self.core_wait = CORE_WAIT  # the manual API makes a recorder per action: one reader for all

    def begin(self):
        wait_ns = self.core_wait.read_ns()
        return time.time_ns() // 1000, time.perf_counter_ns(), self.session.device_timer.start(), wait_ns

    def end(self, started, step: int, stage: int, virtual_stage: int, microbatch: int, action: str) -> None:
        start_us, start_ns, event, wait_start_ns = started
        duration_us = round((time.perf_counter_ns() - start_ns) / 1000)
        wait_end_ns = self.core_wait.read_ns() if wait_start_ns is not None else None
        runqueue_wait_us = (wait_end_ns - wait_start_ns) / 1000 if wait_end_ns is not None else None
        row = MICROBATCHES.row(
            step=step,
            stage=stage,
            virtual_stage=virtual_stage,
            microbatch=microbatch,
            action=action,
            start_us=start_us,
            duration_us=duration_us,
            runqueue_wait_us=runqueue_wait_us,
        )
        self.session.device_timer.stop(event, "microbatches", row)


# -- automatic: torch.distributed.pipelining ------------------------------------------------------------------
def is_pipeline_schedule(obj) -> bool:
    """True for a torch.distributed.pipelining schedule (checked without importing pipelining eagerly)."""
    try:
        return isinstance(obj, torch_private.pipeline_schedule_class())
    except Exception:
        return False


def instrument_schedule(session, schedule) -> ScheduleHooks | None:
    """Instrument every stage this rank runs in ``schedule``; returns the hooks (``remove()`` undoes them)."""
    try:
        if any(hooks.schedule is schedule and hooks.active for hooks in _instrumented(session)):
            warn_once("pipeline-twice", f"{type(schedule).__name__} is already instrumented; ignored")
            return None
        _install_p2p_wrappers()
        hooks = ScheduleHooks(session, schedule)
        session.manifest["pipeline"] = hooks.layout()
        session.writer.write_manifest(session.manifest)
        return hooks
    except Exception as exc:
        warn_once("pipeline-instrument", f"could not instrument {type(schedule).__name__} ({exc!r})")
        return None


def _instrumented(session) -> list[ScheduleHooks]:
    return [hooks for hooks in getattr(session, "_hooks", []) if isinstance(hooks, ScheduleHooks)]


def _stages_of(schedule) -> list:
    stages = getattr(schedule, "_stages", None)
    return list(stages) if stages is not None else [schedule._stage]


class ScheduleHooks:
    def __init__(self, session, schedule):
        self.recorder = _Recorder(session)
        self.session = session
        self.schedule = schedule
        self.stages = _stages_of(schedule)
        self.active = True
        self.schedule_steps = 0  # step() calls so far: the step index outside diag.step()
        self._wrapped: list[tuple[object, str]] = []
        for stage in self.stages:
            self._wrap_stage(stage)
        self._wrap(schedule, "step", self._counting_step)

    def layout(self) -> dict:
        first = self.stages[0]
        return {
            "schedule": type(self.schedule).__name__,
            "stages": int(first.group_size),  # pipeline ranks
            "virtual_stages": len(self.stages),  # model chunks per rank (1 unless interleaved / V-shaped)
            "microbatches": int(self.schedule._n_microbatches),
            "stage": int(first.group_rank),
        }

    def current_step(self) -> int:
        step = self.session.current_step_or_none()
        return step if step >= 0 else self.schedule_steps

    def remove(self) -> None:
        self.active = False
        for obj, name in self._wrapped:
            with suppress(Exception):
                delattr(obj, name)  # the instance attribute goes; the class's method shows through again
        self._wrapped.clear()

    # -- wrapping ------------------------------------------------------------------------------------------
    def _wrap(self, obj, name: str, make_wrapper) -> None:
        setattr(obj, name, make_wrapper(obj, getattr(obj, name)))
        self._wrapped.append((obj, name))

    def _wrap_stage(self, stage) -> None:
        self._wrap(stage, "forward_one_chunk", self._timed_compute(_forward_action))
        self._wrap(stage, "backward_one_chunk", self._timed_compute(_backward_action))
        self._wrap(stage, "backward_weight_one_chunk", self._timed_compute(_weight_action))
        for getter in _OP_GETTERS:
            self._wrap(stage, getter, self._tagging_getter)

    def _counting_step(self, _schedule, original):
        def step(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                self.schedule_steps += 1

        return step

    def _timed_compute(self, classify):
        """Wrapper factory: time one compute call and write its row; the call itself is never altered."""

        def make(stage, original):
            def timed(*args, **kwargs):
                started = self._begin(stage)
                try:
                    return original(*args, **kwargs)
                finally:
                    if started is not None:
                        self._end(started, stage, args, kwargs, classify)

            return timed

        return make

    def _begin(self, _stage):
        try:  # inactive once removed: a wrapper a caller kept a reference to records nothing
            return self.recorder.begin() if self.active else None
        except Exception as exc:
            warn_once("pipeline-hook", f"pipeline timing failed ({exc!r}); some micro-batch rows are missing")
            return None

    def _end(self, started, stage, args, kwargs, classify) -> None:
        try:
            action = classify(stage, args, kwargs)
            if action is None:
                return
            microbatch = int(args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1)))
            self.recorder.end(
                started, self.current_step(), int(stage.group_rank), int(stage.stage_index), microbatch, action
            )
        except Exception as exc:
            warn_once("pipeline-hook", f"pipeline timing failed ({exc!r}); some micro-batch rows are missing")

    def _tagging_getter(self, stage, original):
        """The stage's P2P ops carry (hooks, micro-batch, stage) so their waits can be attributed."""

        def getter(chunk_id, *args, **kwargs):
            ops = original(chunk_id, *args, **kwargs)
            try:
                if ops and self.active:  # most calls at the pipeline's ends return no ops
                    tag = (self, int(chunk_id), int(stage.group_rank), int(stage.stage_index))
                    for op in ops:
                        setattr(op, _TAG, tag)
            except Exception as exc:
                warn_once("pipeline-p2p-tag", f"cannot attribute pipeline waits ({exc!r})")
            return ops

        return getter

    def record_wait(self, started, tag_info: tuple) -> None:
        action, microbatch, stage, virtual_stage = tag_info
        self.recorder.end(started, self.current_step(), stage, virtual_stage, microbatch, action)


def _forward_action(_stage, _args, _kwargs) -> str:
    return "forward"


def _backward_action(stage, args, kwargs) -> str | None:
    if not stage.has_backward:
        return None  # eval: torch returns at once, nothing ran
    full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
    return "backward" if full else "backward_input"


def _weight_action(stage, _args, _kwargs) -> str | None:
    return "backward_weight" if stage.has_backward else None


# -- the process-wide P2P wrappers ---------------------------------------------------------------------------
_originals: dict[str, object] = {}


class _TaggedWorks(list):
    """The works of one batch of P2P ops, remembering which micro-batch and stage they serve."""


def _install_p2p_wrappers() -> None:
    from torch.distributed.pipelining import schedules

    if _originals:
        return
    _originals["batch"] = schedules._batch_p2p
    _originals["wait"] = schedules._wait_batch_p2p
    schedules._batch_p2p = _batch_p2p
    schedules._wait_batch_p2p = _wait_batch_p2p


def _batch_p2p(p2p_ops, *args, **kwargs):
    works = _originals["batch"](p2p_ops, *args, **kwargs)
    try:
        tag = _batch_tag(p2p_ops)
        if tag is None:
            return works
        tagged = _TaggedWorks(works)
        setattr(tagged, _TAG, tag)
        return tagged
    except Exception as exc:
        warn_once("pipeline-p2p-tag", f"cannot attribute pipeline waits ({exc!r})")
        return works


def _batch_tag(p2p_ops):
    """(hooks, (action, microbatch, stage, virtual_stage)) of a batch: a batch holding a receive is a
    recv wait (the data the stage needs next), else a send wait."""
    import torch.distributed as dist

    tagged = [(op, getattr(op, _TAG)) for op in p2p_ops if hasattr(op, _TAG)]
    if not tagged:
        return None
    receives = [(op, tag) for op, tag in tagged if op.op is dist.irecv]
    _op, (hooks, microbatch, stage, virtual_stage) = (receives or tagged)[0]
    return hooks, ("recv_wait" if receives else "send_wait", microbatch, stage, virtual_stage)


def _wait_batch_p2p(work, *args, **kwargs):
    tag = getattr(work, _TAG, None)
    if tag is None or not tag[0].active:
        return _originals["wait"](work, *args, **kwargs)
    hooks, info = tag
    started = _safe_begin(hooks)
    try:
        return _originals["wait"](work, *args, **kwargs)
    finally:
        if started is not None:
            try:
                hooks.record_wait(started, info)
            except Exception as exc:
                warn_once("pipeline-hook", f"pipeline timing failed ({exc!r}); some micro-batch rows are missing")


def _safe_begin(hooks):
    try:
        return hooks.recorder.begin()
    except Exception as exc:
        warn_once("pipeline-hook", f"pipeline timing failed ({exc!r}); some micro-batch rows are missing")
        return None


# -- manual API --------------------------------------------------------------------------------------------
def check_action(action: str) -> None:
    """A wrong action name is the caller's bug: said at once, like a wrong ``diag.init`` option."""
    if action not in ACTIONS:
        raise ValueError(f"diag.pipeline_action: action must be one of {', '.join(ACTIONS)}; got {action!r}")


@contextmanager
def pipeline_action(session, action: str, microbatch: int, stage: int | None = None, virtual_stage=None):
    """Time the body as one micro-batch ``action`` on ``stage`` (default: the manifest's pipeline stage, else
    this rank). The user's exceptions propagate; diag's own failures are one warning."""
    check_action(action)
    recorder, started = None, None
    try:
        recorder = _Recorder(session)
        started = recorder.begin()
    except Exception as exc:
        warn_once("pipeline-action", f"pipeline_action failed ({exc!r}); its row is missing")
    try:
        yield
    finally:
        if started is not None:
            try:
                position = _default_stage(session) if stage is None else int(stage)
                chunk = position if virtual_stage is None else int(virtual_stage)
                recorder.end(started, session.current_step_or_none(), position, chunk, int(microbatch), action)
            except Exception as exc:
                warn_once("pipeline-action", f"pipeline_action failed ({exc!r}); its row is missing")


def _default_stage(session) -> int:
    layout = session.manifest.get("pipeline") or {}
    stage = layout.get("stage")
    return int(stage) if stage is not None else int(session.rank)


def pipeline_layout(session, schedule: str, stages: int, microbatches: int, virtual_stages: int = 1, stage=None):
    """Record the manifest's ``pipeline`` key for an engine diag does not instrument itself."""
    try:
        session.manifest["pipeline"] = {
            "schedule": str(schedule),
            "stages": int(stages),
            "virtual_stages": int(virtual_stages),
            "microbatches": int(microbatches),
            "stage": int(session.rank if stage is None else stage),
        }
        session.writer.write_manifest(session.manifest)
    except Exception as exc:
        warn_once("pipeline-layout", f"pipeline_layout failed ({exc!r})")
