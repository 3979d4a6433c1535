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
    """Context manager around one training step: one optimizer update, from its first forward to the end of
    ``optimizer.step()``.

    ``step_index``: the step's number (default: one more than the last, from 0); ``samples`` and ``tokens``:
    how many the step trained on, for throughput. An exception leaving the block is recorded as the step's
    error (``diag analyze`` and ``diag triage`` read it) and raised again; the block never raises one of its own.

    With gradient accumulation, one ``diag.step()`` spans all the micro-batches of an update::

        for micro_batches in diag.wrap_loader(loader):          # each item: one update's micro-batches
            with diag.step(samples=sum(len(b) for b in micro_batches)):
                for i, batch in enumerate(micro_batches):
                    last = i == len(micro_batches) - 1
                    with contextlib.nullcontext() if last else model.no_sync():   # DDP: all-reduce once
                        (model(batch).loss / len(micro_batches)).backward()
                optimizer.step()
                optimizer.zero_grad()

    Every micro-batch's forward and backward count in the step's phases. Called once per micro-batch with the
    same number instead, it warns once, and the report counts each micro-batch as a step."""
    from diag.capture import api

    return api.step(step_index, samples=samples, tokens=tokens)


def record(loss=None, grad_norm=None):
    """The current step's loss and, when you have it, gradient norm (e.g. what ``clip_grad_norm_`` returns):
    numbers or 0-d tensors, read from the GPU without waiting for it. ``diag analyze`` names the first NaN or
    inf (step and rank), loss spikes, and ranks whose loss or gradient norm departs from their peers'."""
    from diag.capture import api

    return api.record(loss=loss, grad_norm=grad_norm)


def phase(name: str):
    """Context manager marking a named span inside the current step (the ``phases`` table; the dashboard and
    ``diag export`` draw it). ``"forward"``, ``"backward"`` and ``"optimizer"`` are the step's own phases: a
    span of one of those names adds its time to that phase, once, also around a call whose hooks time it
    (open it around a compiled call whose hooks run inside the compiled region). Open it in eager code, not
    inside a ``torch.compile``-d function, where it would break the graph."""
    from diag.capture import api

    return api.phase(name)


def instrument(*objects, step_at: str | None = None):
    """Hook models and optimizers: each step's forward, backward and optimizer time, and the collectives they
    issue; returns what it was given. Call it after ``diag.init``, on what your loop calls.

    Models: a plain ``nn.Module``, a DDP module (its gradient buckets too), an FSDP2 (``fully_shard``) module,
    a DTensor model on a ``DeviceMesh`` (the whole mesh is recorded, for communication per dimension), what
    ``torch.compile`` returned (no graph break, no recompilation), a ``torch.distributed.pipelining``
    schedule (every micro-batch's forward and backward per stage), a DeepSpeed engine, an Accelerate-prepared
    model. Order: wrap (DDP, ``fully_shard``, ``parallelize_module``), then ``torch.compile``, then
    ``diag.instrument`` on the result (docs/frameworks.md).

    ``step_at="accumulation_boundary"`` with a DeepSpeed engine: diag opens and closes the steps itself, one per
    optimizer update (the engine's gradient-accumulation boundary), so the loop needs no ``diag.step()``."""
    from diag.capture import api

    return api.instrument(*objects, step_at=step_at)


def wrap_loader(loader):
    """Iterate ``loader`` while recording the time each batch took to arrive: the next step's data wait
    (a rank slow in its data loader is told apart from one slow in compute). An error the loader raises is
    recorded and raised again."""
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
    """Flush and close the current session: the rows still buffered are written and the rank marked finished
    (``diag triage`` tells a finished rank from one that stopped). Safe to call twice, and in a ``finally``
    block; a rank that exits without it (an exception out of the script, a signal) is recorded as such."""
    from diag.capture import api

    return api.finish()


def session():
    """The current capture session (a disabled one before ``diag.init``, and after ``diag.finish``)."""
    from diag.capture import api

    return api.current()


def load(trace_dir, progress: bool = False):
    """Load a trace directory into pandas DataFrames (no torch needed): a ``Trace`` whose ``steps``,
    ``phases``, ``collectives``, ``memory``, ``telemetry`` ... hold every rank's rows with a ``rank`` column
    (their columns: docs/trace-format.md), with the manifests and what was skipped and why."""
    from diag.trace.loader import load as _load

    return _load(trace_dir, progress=progress)


def __getattr__(name):
    if name == "Trainer":
        from diag.capture.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'diag' has no attribute {name!r}")
