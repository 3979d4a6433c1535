"""Hugging Face ``transformers.Trainer``: ``DiagTrainerCallback`` does what ``diag.init`` + ``diag.step`` do.

    trainer = transformers.Trainer(..., callbacks=[DiagTrainerCallback("traces/run1", flops_per_step=...)])

What one diag step is: one optimizer step, from ``on_step_begin`` to ``on_step_end``; with
``gradient_accumulation_steps=k`` it spans k micro-batches (``on_substep_end`` between them), its index is
``state.global_step`` when it began, its ``samples`` (and ``tokens``, from ``input_ids``) are summed over the
micro-batches the model saw. Forward and backward are timed by hooks on the model (``diag.instrument``),
the optimizer from ``on_pre_optimizer_step`` to ``on_optimizer_step``. Data wait: the Trainer fetches all of
a step's micro-batches just before ``on_step_begin``, after its logging, evaluation and checkpointing, each of
which ends with an event (``on_log``, ``on_evaluate``, ``on_save``); the wait is the time from the last such
event (or ``on_step_end``, or the epoch's start) to ``on_step_begin``. DDP gradient buckets are recorded
through a communication hook on the DDP wrapper, found at the model's first forward (the Trainer passes
callbacks the unwrapped model only).

Training health: the step's loss is the mean of the losses its micro-batches' forward returned (a model output
with ``loss``, as transformers models give when the batch has labels), kept on the device and given to
``diag.record`` at ``on_step_end``. The gradient norm is not recorded: the Trainer clips before
``on_pre_optimizer_step`` and keeps the norm to itself until its logging.

Failures: the Trainer has no exception event. At ``on_train_begin`` the callback finds the Trainer that called
it and wraps that instance's ``training_step`` (forward and backward, where a collective timeout or an OOM
raises): a step that raises is recorded as failed with its exception, and the session the callback opened is
finished, as Lightning's ``on_exception`` does; the exception still leaves ``trainer.train()``. So a script
that catches it and goes on gets the verdict the uncaught error would have given. An exception outside
``training_step`` (the optimizer step, a data loader) leaves the step open: the watchdog records it at exit
when it is not caught.
"""

from __future__ import annotations

import sys

from diag._warn import warn_once
from diag.integrations._driver import StepDriver, guarded, missing_framework

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:
    raise missing_framework("transformers", "huggingface") from None


class DiagTrainerCallback(_TrainerCallback):
    """A ``transformers.TrainerCallback`` capturing ``Trainer.train`` with diag;
    ``DiagTrainerCallback(trace_dir, **init_options)`` with the options of ``diag.init``. The session starts
    at ``on_train_begin`` (the Trainer has set up torch.distributed and wrapped the model by then, so ranks
    come from torch.distributed) and finishes at ``on_train_end``; a session the user started with
    ``diag.init`` is used and left open."""

    def __init__(self, trace_dir, **init_options):
        self._driver = StepDriver(trace_dir, init_options)
        self._model = None
        self._ddp_looked_up = False
        self._micro_losses: list = []  # the open step's micro-batch losses, on their device

    # -- start ---------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._driver.start()
        self._instrument(model)
        self._track_optimizer(kwargs.get("optimizer"))
        self._catch_step_errors(_calling_trainer())
        self._driver.data_wait_begin(mark_phase=False)

    @guarded
    def _catch_step_errors(self, trainer) -> None:
        """Wrap ``trainer.training_step`` on the instance (removed at finish): a step that raises is recorded."""
        if trainer is None:
            warn_once("hf-trainer", "the Trainer calling the callback was not found: a failed step is not recorded")
            return
        if not self._driver.session.enabled or getattr(trainer.training_step, "__diag_wrapped__", False):
            return
        original = trainer.training_step

        def training_step(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                self._on_step_raised(exc)
                raise

        training_step.__diag_wrapped__ = True
        self._driver.keep_handle(_InstanceAttribute(trainer, "training_step", training_step))

    def _on_step_raised(self, error: BaseException) -> None:
        """Training ends with this exception: the open step failed, and the session this callback opened ends."""
        self._micro_losses = []
        self._driver.finish(error)
        self._model = None

    @guarded
    def _track_optimizer(self, optimizer) -> None:
        """The Trainer's optimizer, for memory by category (the model is instrumented already)."""
        if optimizer is not None and self._driver.session.enabled:
            self._driver.session.track_memory_of(optimizer=optimizer)

    @guarded
    def _instrument(self, model) -> None:
        session = self._driver.session
        if not session.enabled or model is None or model is self._model:
            return
        self._model, self._ddp_looked_up = model, False
        session.instrument(model)
        self._driver.keep_handle(model.register_forward_pre_hook(self._before_forward, with_kwargs=True))
        self._driver.keep_handle(model.register_forward_hook(self._after_forward))

    @guarded
    def _before_forward(self, module, args, kwargs):
        if not self._driver.step_open:
            return None  # evaluation or prediction between steps
        if not self._ddp_looked_up:
            self._ddp_looked_up = True
            self._instrument_ddp(module)
        batch = kwargs or args
        input_ids = kwargs.get("input_ids") if kwargs else None
        self._driver.count_batch(batch, tokens=int(input_ids.numel()) if input_ids is not None else None)
        return None

    @guarded
    def _after_forward(self, module, args, output):
        if not self._driver.step_open:
            return None
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is not None and hasattr(loss, "detach") and loss.numel() == 1:
            self._micro_losses.append(loss.detach().reshape(()))
        return None

    @guarded
    def _record_loss(self) -> None:
        losses, self._micro_losses = self._micro_losses, []
        if losses and self._driver.session.enabled:
            import torch

            self._driver.session.record(loss=torch.stack(losses).float().mean())

    def _instrument_ddp(self, module) -> None:
        """Called inside DDP's forward: DDP names itself the active module there (for torch.compile)."""
        import torch

        ddp_class = torch.nn.parallel.DistributedDataParallel
        active = getattr(ddp_class, "_get_active_ddp_module", lambda: None)()
        if isinstance(active, ddp_class) and active.module is module:
            self._driver.session.instrument_ddp_buckets(active)
            self._driver.session.track_memory_of(module=active)  # the manifest's sharding: ddp (docs/memory.md)

    # -- between steps: the data wait ends at the step's start ------------------------------------------------
    def on_epoch_begin(self, args, state, control, **kwargs):
        self._driver.data_wait_begin(mark_phase=False)

    def on_log(self, args, state, control, **kwargs):
        if not self._driver.step_open:
            self._driver.data_wait_begin(mark_phase=False)

    def on_evaluate(self, args, state, control, **kwargs):
        if not self._driver.step_open:
            self._driver.data_wait_begin(mark_phase=False)

    def on_save(self, args, state, control, **kwargs):
        if not self._driver.step_open:
            self._driver.data_wait_begin(mark_phase=False)

    # -- steps and phases ----------------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._micro_losses = []
        self._driver.begin_step(state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._driver.begin_phase("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._driver.end_phase("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        self._record_loss()
        self._driver.end_step()
        self._driver.data_wait_begin(mark_phase=False)

    # -- end -----------------------------------------------------------------------------------------------
    def on_train_end(self, args, state, control, **kwargs):
        self._driver.finish()
        self._model = None


class _InstanceAttribute:
    """``obj.name = value`` on the instance, and ``remove()`` putting back what the instance had (a handle)."""

    def __init__(self, obj, name: str, value):
        self._obj, self._name = obj, name
        self._previous = obj.__dict__.get(name)
        setattr(obj, name, value)

    def remove(self) -> None:
        if self._previous is None:
            self._obj.__dict__.pop(self._name, None)
        else:
            setattr(self._obj, self._name, self._previous)


def _calling_trainer():
    """The Trainer whose callback handler is calling us (``Trainer._inner_training_loop`` calls
    ``on_train_begin``): the events pass the callbacks the model, the optimizer and the data loaders, never the
    Trainer itself. None if no caller up the stack has a ``training_step`` and a ``callback_handler``."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "callback_handler") and callable(getattr(owner, "training_step", None)):
            return owner
        frame = frame.f_back
    return None
