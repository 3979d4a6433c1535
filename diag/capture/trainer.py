"""``diag.Trainer``: a plain training loop with capture built in, for users without a loop of their own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from diag.capture import api


class Trainer:
    """Train ``model`` with ``optimizer`` and record every step.

    ``loss_fn(outputs, targets)`` is called with the model's outputs and the batch's targets when batches are
    ``(inputs, targets)`` pairs; otherwise ``loss_fn(outputs, batch)``. Options: ``grad_accum_steps``
    micro-batches per optimizer step; ``amp_dtype`` (torch.bfloat16 or torch.float16) for autocast, with a
    gradient scaler for float16 on CUDA; ``max_grad_norm`` to clip; ``device`` to move batches to; and
    ``session_options`` passed to ``diag.init`` (when ``trace_dir`` is given and no session is active).
    """

    def __init__(
        self,
        model,
        optimizer,
        loss_fn: Callable,
        trace_dir: str | None = None,
        *,
        grad_accum_steps: int = 1,
        amp_dtype=None,
        max_grad_norm: float | None = None,
        device=None,
        session_options: dict | None = None,
    ):
        import torch

        if grad_accum_steps < 1:
            raise ValueError("grad_accum_steps must be at least 1")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.trace_dir = trace_dir
        self.grad_accum_steps = grad_accum_steps
        self.amp_dtype = amp_dtype
        self.max_grad_norm = max_grad_norm
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.session_options = dict(session_options or {})
        given = self.session_options.get("config")  # a CaptureConfig's own dtype, when set, is the user's word
        if amp_dtype is not None and "dtype" not in self.session_options and getattr(given, "dtype", None) is None:
            self.session_options["dtype"] = str(amp_dtype).removeprefix("torch.")
        use_scaler = amp_dtype == torch.float16 and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.losses: list[float] = []

    def fit(self, loader: Iterable, max_steps: int | None = None) -> list[float]:
        """Run until the loader is exhausted or ``max_steps`` optimizer steps; returns each step's mean loss."""
        owns_session = self.trace_dir is not None and not api.current().enabled
        if owns_session:
            api.init(self.trace_dir, **self.session_options)
        api.instrument(self.model, self.optimizer)
        try:
            batches = iter(api.wrap_loader(loader))
            step = 0
            while max_steps is None or step < max_steps:
                micro_batches = [b for _, b in zip(range(self.grad_accum_steps), batches)]
                if not micro_batches:
                    break
                with api.step(samples=sum(_batch_size(b) for b in micro_batches) or None):
                    self.losses.append(self._train_step(micro_batches))
                step += 1
        finally:
            if owns_session:
                api.finish()
        return self.losses

    def _train_step(self, micro_batches: list) -> float:
        import torch

        total = 0.0
        for index, batch in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with sync:
                with self._autocast():
                    loss = self._loss(batch) / len(micro_batches)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += float(loss.detach())
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        api.record(loss=total, grad_norm=grad_norm)  # training health: NaNs, spikes, ranks apart
        return total

    def _loss(self, batch):
        batch = _to_device(batch, self.device)
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            inputs, targets = batch
            return self.loss_fn(self.model(inputs), targets)
        return self.loss_fn(self.model(batch), batch)

    def _autocast(self):
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)


def _to_device(batch, device):
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _batch_size(batch) -> int:
    import torch

    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 0
