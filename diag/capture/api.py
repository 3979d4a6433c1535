"""The module-level API (``diag.init``, ``diag.step``, ...) over one process-wide session."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

from diag._warn import warn_once
from diag.capture.config import CaptureConfig, check_option_names
from diag.capture.session import DisabledSession, Session
from diag.extras import require

_DISABLED = DisabledSession()
_current: Session | DisabledSession = _DISABLED


def init(trace_dir, config: CaptureConfig | None = None, **options) -> Session | DisabledSession:
    global _current
    if _current.enabled:
        warn_once("init-twice", "diag.init called twice; finishing the previous session first")
        finish()
    # A misspelt option (TypeError) or a plainly wrong value (ValueError) is the caller's bug: said at once,
    # before anything starts, not capture silently hurting
    config = _config(config, options)
    try:
        require("capture", "diag.init")
        _current = Session(trace_dir, config)
    except Exception as exc:
        warn_once("init", f"capture could not start ({exc!r}); the job runs without it")
        _current = _DISABLED
    return _current


def _config(config: CaptureConfig | None, options: dict) -> CaptureConfig:
    """The options given and the ``DIAG_*`` environment; or ``config`` as given, with ``options`` replacing its
    fields."""
    if config is None:
        return CaptureConfig.from_environment(**options)
    if not isinstance(config, CaptureConfig):
        raise TypeError(f"diag.init's config must be a CaptureConfig, not {config!r}")
    check_option_names(options)
    return dataclasses.replace(config, **options)


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
