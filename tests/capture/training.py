"""A tiny instrumented training loop shared by the capture tests (both tiers)."""

import torch

import diag


def train(steps: int = 4) -> list[float]:
    """A tiny instrumented training loop; returns its losses (deterministic)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.instrument(model, optimizer)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(steps)]
    losses = []
    for x, y in diag.wrap_loader(data):
        with diag.step():
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def reference_losses() -> list[float]:
    assert not diag.session().enabled
    return train()
