"""Framework wrappers that ``diag.instrument`` understands: DeepSpeed engines and ZeRO optimizers, Accelerate's
prepared optimizer.

Recognised by class name and module (duck typing), never by importing the framework: diag stays light and a
job without DeepSpeed never loads it.

* DeepSpeed engine (``deepspeed.initialize``'s first value): forward is the engine's forward (hooks on the engine
  module); backward is the whole ``engine.backward`` call, which holds ZeRO's gradient reduction as well as
  autograd (the autograd call inside it is not counted twice); optimizer is the whole ``engine.step`` call,
  which holds ZeRO's parameter all-gather. Both methods are wrapped on the instance, not on the class.
* DeepSpeed ZeRO optimizer (``DeepSpeedZeroOptimizer``, ``DeepSpeedZeroOptimizer_Stage3``, ...): its ``step``
  is the optimizer phase, unless an instrumented engine's ``step`` already times it.
* Accelerate ``AcceleratedOptimizer``: it skips ``torch.optim.Optimizer.__init__``, so it has no step hooks of
  its own; its ``.optimizer`` (the user's optimizer) is instrumented instead. A prepared model is the user's
  module or a DDP/FSDP wrapper: ``instrument`` already knows those.
"""

from __future__ import annotations

import functools
import time

from diag._warn import warn_once
from diag.capture import hooks


def _class_path(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def is_deepspeed_engine(obj) -> bool:
    return any(
        c.__module__.startswith("deepspeed.") and c.__name__.endswith("Engine") for c in type(obj).__mro__
    ) and callable(getattr(obj, "backward", None))


def is_deepspeed_optimizer(obj) -> bool:
    return type(obj).__module__.startswith("deepspeed.") and callable(getattr(obj, "step", None))


def is_accelerated_optimizer(obj) -> bool:
    return type(obj).__name__ == "AcceleratedOptimizer" and type(obj).__module__.startswith("accelerate.")


def instrument_framework(session, obj, step_at: str | None = None) -> bool:
    """Instrument ``obj`` if it is a framework wrapper this module knows; False if it is not one."""
    from diag.capture import megatron

    if megatron.is_megatron_schedules(obj):
        hooks_ = megatron.instrument(session, obj)
        if hooks_ is not None:
            session._hooks.append(hooks_)
        return True
    if is_accelerated_optimizer(obj):
        session.instrument(obj.optimizer)
        return True
    if is_deepspeed_engine(obj):
        _instrument_deepspeed_engine(session, obj, step_at)
        return True
    if is_deepspeed_optimizer(obj):
        session.track_memory_of(optimizer=obj)
        if not getattr(obj.step, "__diag_wrapped__", False):
            session._hooks.append(_MethodWrap(obj, "step", _OptimizerPhase(session)))
        return True
    return False


def _instrument_deepspeed_engine(session, engine, step_at: str | None = None) -> None:
    # forward and the backward listener, as for any module (the engine is a torch.nn.Module)
    session._hooks.append(hooks.ModelHooks(session, engine))
    if not any(isinstance(h, hooks.BackwardHooks) for h in session._hooks):
        session._hooks.append(hooks.BackwardHooks(session))
    session._hooks.append(_MethodWrap(engine, "backward", _BackwardPhase()))
    session._hooks.append(_MethodWrap(engine, "step", _OptimizerPhase(session)))
    optimizer = getattr(engine, "optimizer", None)
    session.track_memory_of(module=engine, optimizer=optimizer if is_deepspeed_optimizer(optimizer) else None)
    if optimizer is not None and is_deepspeed_optimizer(optimizer):
        # engine.step calls optimizer.step: mark it timed so that instrumenting it too does not count twice
        session._hooks.append(_MethodWrap(optimizer, "step", _Passthrough()))
    accumulation_steps = _call_or_none(engine, "gradient_accumulation_steps")
    if step_at == "accumulation_boundary":
        session._hooks.append(_BoundarySteps(session, engine))
    elif accumulation_steps and accumulation_steps > 1:
        warn_once(
            "deepspeed-accumulation",
            f"DeepSpeed accumulates gradients over {accumulation_steps} micro-steps: diag's step is the user's "
            "diag.step(); for one step per optimizer update use diag.instrument(engine, "
            'step_at="accumulation_boundary") and no diag.step(), or open diag.step() around the micro-steps',
        )
    if getattr(engine, "pipeline_parallelism", False) or _class_path(engine).endswith("PipelineEngine"):
        warn_once(
            "deepspeed-pipeline",
            "diag times DeepSpeed's PipelineEngine.train_batch as a whole; its per-microbatch stages are not hooked",
        )


def _call_or_none(obj, name: str):
    try:
        return getattr(obj, name)()
    except Exception:
        return None


class _BoundarySteps:
    """One diag step per optimizer update of a DeepSpeed engine: opened before the first forward after an
    update (or the first of all), closed when an ``engine.step()`` at the gradient-accumulation boundary
    returns. Wraps ``engine.step`` over the optimizer-phase wrapper, so the update's time is in the step."""

    def __init__(self, session, engine):
        self.session, self.engine = session, engine
        # before diag's forward timing hook (prepend), so that the forward falls inside the step it opens
        self._handle = engine.register_forward_pre_hook(self._open, prepend=True)
        self._step = _MethodWrap(engine, "step", self._close_after)

    def _open(self, *_):
        try:
            if self.session.current_step is None:
                self.session.begin_step(None)
        except Exception as exc:  # never into the user's forward
            warn_once("deepspeed-boundary", f"opening a step at the accumulation boundary failed ({exc!r})")

    def _close_after(self, original, *args, **kwargs):
        at_boundary = bool(_call_or_none(self.engine, "is_gradient_accumulation_boundary"))
        result = original(*args, **kwargs)
        if at_boundary:
            try:
                self.session.end_step()
            except Exception as exc:
                warn_once("deepspeed-boundary", f"closing a step at the accumulation boundary failed ({exc!r})")
        return result

    def remove(self):
        self._handle.remove()
        self._step.remove()


class _BackwardPhase:
    """``engine.backward``: one backward pass for the session's listeners, so the ``torch.autograd.backward``
    inside it is nested (not counted twice) and ZeRO's reduction after it counts."""

    def __call__(self, original, *args, **kwargs):
        return hooks.run_as_backward(original, *args, **kwargs)


class _OptimizerPhase:
    """A framework's optimizer step (engine.step, a ZeRO optimizer's step) as the optimizer phase; nested calls
    (a ZeRO optimizer's step inside engine.step) are the outer call's time."""

    def __init__(self, session):
        self.session = session
        self._depth = 0

    def __call__(self, original, *args, **kwargs):
        self._depth += 1
        start_ns = time.perf_counter_ns() if self._depth == 1 else None
        if start_ns is not None:
            self._safe(self.session.set_phase, "optimizer")
        try:
            return original(*args, **kwargs)
        finally:
            self._depth -= 1
            if start_ns is not None:
                self._safe(self.session.set_phase, None)
                self._safe(self.session.add_phase_time, "optimizer", (time.perf_counter_ns() - start_ns) / 1000)

    @staticmethod
    def _safe(function, *args):
        try:
            function(*args)
        except Exception as exc:  # never into the user's step
            warn_once("framework-optimizer", f"optimizer timing failed ({exc!r}); its timing is missing")


class _Passthrough:
    def __call__(self, original, *args, **kwargs):
        return original(*args, **kwargs)


class _MethodWrap:
    """Replace ``obj.name`` by a wrapper on the instance (the class and other instances are untouched);
    ``remove`` puts the instance back as it was."""

    def __init__(self, obj, name: str, timer):
        self.obj, self.name = obj, name
        self._had_own = name in vars(obj)
        self._own = vars(obj).get(name)
        original = getattr(obj, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            return timer(original, *args, **kwargs)

        wrapped.__diag_wrapped__ = True
        setattr(obj, name, wrapped)

    def remove(self):
        if self._had_own:
            setattr(self.obj, self.name, self._own)
        else:
            vars(self.obj).pop(self.name, None)
