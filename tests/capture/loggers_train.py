"""A short real training run with diag's loggers, shared by the logger tests and the W&B job they start."""

from __future__ import annotations

import diag

STEPS = 6


def train(trace_dir, **options) -> list[float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(trace_dir, telemetry=False, watchdog=False, **options)
    diag.instrument(model, optimizer)
    losses = []
    for _ in range(STEPS):
        with diag.step(samples=16):
            loss = model(torch.randn(16, 8)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            diag.record(loss=loss)
            losses.append(float(loss.detach()))
    diag.finish()
    return losses
