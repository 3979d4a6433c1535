"""PyTorch Lightning: ``DiagCallback`` does what ``diag.init`` + ``diag.step`` do in a loop of your own.

    trainer = lightning.pytorch.Trainer(..., callbacks=[DiagCallback("traces/run1", flops_per_step=...)])

What one diag step is: one optimizer step (``trainer.global_step`` advancing), so with
``accumulate_grad_batches=k`` a step spans k training batches; its index is ``trainer.global_step`` when it
began, its ``samples`` the leading dimension of its batches summed. Phases come from Lightning's own
events, not from hooks on the model (Lightning calls ``training_step`` directly, outside ``forward``, when
the model is not wrapped): forward from the batch's start (or the previous backward) to
``on_before_backward``, backward to ``on_after_backward`` (DDP's gradient all-reduces included), optimizer
from ``on_before_optimizer_step`` (gradient clipping included) to the end of the optimizer's ``step``;
data wait is Lightning's own fetch of the next training batch. DDP gradient buckets are recorded through
a communication hook on ``trainer.strategy.model``.

``pytorch_lightning`` (the older package name) has its own class: ``diag.integrations.pytorch_lightning``.
"""

from __future__ import annotations

from diag.integrations._driver import StepDriver, guarded, missing_framework

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # the older package name; diag.integrations.pytorch_lightning names it explicitly
    try:
        from pytorch_lightning import Callback as _Callback
    except ImportError:
        raise missing_framework("lightning", "lightning") from None

_FETCH_ACTION = "train_dataloader_next"  # the profiler action Lightning wraps around each training-batch fetch


class DiagCallbackMixin:
    """The callback's body, shared by the ``lightning`` and ``pytorch_lightning`` classes."""

    def __init__(self, trace_dir, **init_options):
        """``trace_dir`` and ``init_options`` as for ``diag.init`` (flops_per_step, peak_tflops, ...)."""
        super().__init__()
        self._driver = StepDriver(trace_dir, init_options)
        self._global_step_at_begin = 0
        self._profiler = None

    # -- start: the strategy has set up distributed before ``setup``; it wraps the model before fit starts ---
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._driver.start()

    def on_fit_start(self, trainer, pl_module) -> None:
        self._instrument(trainer)

    @guarded
    def _instrument(self, trainer) -> None:
        import torch

        session = self._driver.session
        if not session.enabled:
            return
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            session.instrument_ddp_buckets(model)
        for optimizer in trainer.optimizers:
            self._driver.keep_handle(optimizer.register_step_post_hook(self._after_optimizer_step))
        for index, optimizer in enumerate(trainer.optimizers):  # memory by category (docs/memory.md)
            session.track_memory_of(module=model if index == 0 else None, optimizer=optimizer)
        self._wrap_profiler(trainer.profiler)

    def _wrap_profiler(self, profiler) -> None:
        """Lightning brackets each training-batch fetch with ``profiler.start``/``stop``: time the data wait
        there, on this trainer's profiler instance only."""
        start, stop = profiler.start, profiler.stop
        driver = self._driver

        def start_action(action_name: str) -> None:
            if action_name.endswith(_FETCH_ACTION):
                driver.data_wait_begin()
            start(action_name)

        def stop_action(action_name: str) -> None:
            stop(action_name)
            if action_name.endswith(_FETCH_ACTION):
                driver.data_wait_end()

        profiler.start, profiler.stop = start_action, stop_action
        self._profiler = profiler

    @guarded
    def _unwrap_profiler(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            for name in ("start", "stop"):
                if name in vars(profiler):
                    delattr(profiler, name)

    # -- steps and phases ----------------------------------------------------------------------------------
    @guarded
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if not self._driver.step_open:
            self._global_step_at_begin = trainer.global_step
            self._driver.begin_step(trainer.global_step)
        self._driver.count_batch(batch)
        self._driver.begin_phase("forward")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._driver.end_phase("forward")
        self._driver.begin_phase("backward")

    def on_after_backward(self, trainer, pl_module) -> None:
        self._driver.end_phase("backward")
        if self._driver.session.enabled:
            self._driver.session.on_backward_end()  # the step's gradients, for memory by category
        self._driver.begin_phase("forward")  # manual optimization may run another forward; dropped if not

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._driver.drop_phase("forward")
        self._driver.begin_phase("optimizer")

    def _after_optimizer_step(self, _optimizer, _args, _kwargs) -> None:
        self._driver.end_phase("optimizer")

    @guarded
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._driver.drop_phase("forward")
        self._driver.end_phase()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self._driver.session.record(loss=loss)  # the last micro-batch's loss (Lightning's own)
        if trainer.global_step != self._global_step_at_begin:  # the optimizer stepped: the step is complete
            self._driver.end_step()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._driver.end_step()  # an epoch that ended inside an accumulation window

    # -- end -----------------------------------------------------------------------------------------------
    def on_fit_end(self, trainer, pl_module) -> None:
        self._finish()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._finish(exception)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._finish()

    def _finish(self, error: BaseException | None = None) -> None:
        self._unwrap_profiler()
        self._driver.finish(error)


class DiagCallback(DiagCallbackMixin, _Callback):
    """A ``lightning.pytorch.Callback`` capturing the fit with diag; ``DiagCallback(trace_dir, **init_options)``
    with the options of ``diag.init``. The session starts in ``setup`` (after Lightning initialised the
    process group, so ranks come from torch.distributed) and finishes at the end of fit or on an exception;
    a session the user started with ``diag.init`` is used and left open."""
