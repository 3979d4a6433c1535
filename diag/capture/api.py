"""The module-level API (``diag.init``, ``diag.step``, ...) over one process-wide session."""

from __future__ import annotations

import inspect
from contextlib import nullcontext

from diag._warn import warn_once
from diag.capture.session import DisabledSession, Session, validate_options
from diag.extras import require

_DISABLED = DisabledSession()
_current: Session | DisabledSession = _DISABLED


def init(trace_dir, **options) -> Session | DisabledSession:
    global _current
    if _current.enabled:
        warn_once("init-twice", "diag.init called twice; finishing the previous session first")
        finish()
    unknown = set(options) - set(inspect.signature(Session.__init__).parameters)
    if unknown:  # a misspelt option is the caller's bug: say so at once, before training starts
        raise TypeError(f"diag.init got unknown options {sorted(unknown)}")
    validate_options(**options)  # a plainly wrong value is a ValueError now, not capture silently hurting
    try:
        require("capture", "diag.init")
        _current = Session(trace_dir, **options)
    except Exception as exc:
        warn_once("init", f"capture could not start ({exc!r}); the job runs without it")
        _current = _DISABLED
    return _current


def current() -> Session | DisabledSession:
    return _current


def step(index=None, samples=None, tokens=None):
    return _current.step(index, samples=samples, tokens=tokens)


def record(loss=None, grad_norm=None):
    return _current.record(loss=loss, grad_norm=grad_norm)


def phase(name: str):
    return _current.phase(name)


STEP_AT = (None, "accumulation_boundary")


def instrument(*objects, step_at: str | None = None):
    if step_at not in STEP_AT:  # a misspelt option must not silently give one step per micro-batch
        raise ValueError(f"step_at must be one of {STEP_AT}, not {step_at!r}")
    _current.instrument(*objects, step_at=step_at)
    return objects[0] if len(objects) == 1 else objects


def wrap_loader(loader):
    return _current.wrap_loader(loader)


def pipeline_action(action: str, microbatch: int, stage: int | None = None, virtual_stage: int | None = None):
    from diag.capture import pipeline

    pipeline.check_action(action)
    if not _current.enabled:
        return nullcontext()
    return pipeline.pipeline_action(_current, action, microbatch, stage, virtual_stage)


def pipeline_layout(schedule: str, stages: int, microbatches: int, virtual_stages: int = 1, stage: int | None = None):
    from diag.capture import pipeline

    if _current.enabled:
        pipeline.pipeline_layout(_current, schedule, stages, microbatches, virtual_stages, stage)


def finish() -> None:
    global _current
    session, _current = _current, _DISABLED
    session.finish()
