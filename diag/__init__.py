"""diag: profiling and diagnostics for distributed PyTorch training.

Capture (inside training, imports torch lazily)::

    session = diag.init("traces/run1")
    diag.instrument(model, optimizer)
    for batch in diag.wrap_loader(loader):
        with diag.step():
            ...
    diag.finish()

Analysis (anywhere, no torch): ``diag.load(trace_dir)`` or ``diag analyze trace_dir``.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "init",
    "step",
    "record",
    "phase",
    "instrument",
    "wrap_loader",
    "pipeline_action",
    "pipeline_layout",
    "finish",
    "session",
    "Trainer",
    "load",
]


def init(trace_dir, config=None, **options):
    from diag.capture import api

    return api.init(trace_dir, config, **options)


def _init_doc() -> str:
    # the options are documented once, as the fields of CaptureConfig (which imports neither torch nor pandas)
    from diag.capture.config import options_text

    return (
        "Start capturing this rank into ``trace_dir``.\n\n"
        "``options`` are the fields of ``diag.capture.config.CaptureConfig`` (docs/capture-options.md); each not "
        "given is read from its ``DIAG_<OPTION>`` environment variable when set. ``config``: a ``CaptureConfig`` "
        "instead (the options given beside it replace its fields; the environment is not read). A misspelt option "
        "is a TypeError, a plainly wrong value a ValueError naming every such option.\n\nOptions:\n\n" + options_text()
    )


init.__doc__ = _init_doc()


def step(step_index: int | None = None, samples: int | None = None, tokens: int | None = None):
    """Context manager around one training step."""
    from diag.capture import api

    return api.step(step_index, samples=samples, tokens=tokens)


def record(loss=None, grad_norm=None):
    """The current step's loss and, when you have it, gradient norm (e.g. what clip_grad_norm_ returns):
    numbers or 0-d tensors, read from the GPU without waiting for it. diag analyze names the first NaN or inf
    (step and rank), loss spikes, and ranks whose loss or gradient norm departs from their peers'."""
    from diag.capture import api

    return api.record(loss=loss, grad_norm=grad_norm)


def phase(name: str):
    """Context manager marking a named span inside the current step."""
    from diag.capture import api

    return api.phase(name)


def instrument(*objects, step_at: str | None = None):
    """Hook a model (plain, DDP, FSDP) and optimizers: forward, backward, optimizer, collectives.

    ``step_at="accumulation_boundary"`` with a DeepSpeed engine: diag opens and closes the steps itself, one per
    optimizer update (the engine's gradient-accumulation boundary), so the loop needs no ``diag.step()``."""
    from diag.capture import api

    return api.instrument(*objects, step_at=step_at)


def wrap_loader(loader):
    """Iterate ``loader`` while recording the time each batch took to arrive."""
    from diag.capture import api

    return api.wrap_loader(loader)


def pipeline_action(action: str, microbatch: int, stage: int | None = None, virtual_stage: int | None = None):
    """Context manager marking one micro-batch's ``action`` on a pipeline stage, for engines diag does not
    instrument itself: forward, backward, backward_input, backward_weight, send_wait or recv_wait."""
    from diag.capture import api

    return api.pipeline_action(action, microbatch, stage=stage, virtual_stage=virtual_stage)


def pipeline_layout(schedule: str, stages: int, microbatches: int, virtual_stages: int = 1, stage: int | None = None):
    """Record the pipeline layout (schedule name, pipeline ranks, micro-batches, chunks per rank, this rank's
    stage) in the manifest, for engines diag does not instrument itself."""
    from diag.capture import api

    return api.pipeline_layout(schedule, stages, microbatches, virtual_stages=virtual_stages, stage=stage)


def finish():
    """Flush and close the current session."""
    from diag.capture import api

    return api.finish()


def session():
    """The current capture session (a disabled one before ``diag.init``)."""
    from diag.capture import api

    return api.current()


def load(trace_dir, progress: bool = False):
    """Load a trace directory into DataFrames (no torch needed)."""
    from diag.trace.loader import load as _load

    return _load(trace_dir, progress=progress)


def __getattr__(name):
    if name == "Trainer":
        from diag.capture.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'diag' has no attribute {name!r}")
