import torch

import diag


def make_data(batches: int, batch_size: int = 8):
    """A learnable target (a fixed linear map), so that training visibly lowers the loss."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 1, generator=generator)
    inputs = [torch.randn(batch_size, 16, generator=generator) for _ in range(batches)]
    return [(x, x @ weight) for x in inputs]


def test_trainer_records_steps_with_gradient_accumulation(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = diag.Trainer(
        model,
        optimizer,
        torch.nn.functional.mse_loss,
        trace_dir=tmp_path,
        grad_accum_steps=2,
        session_options={"telemetry": False},
    )
    data = make_data(11)
    x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    loss_before = torch.nn.functional.mse_loss(model(x), y).item()
    losses = trainer.fit(data, max_steps=5)
    assert len(losses) == 5
    assert torch.nn.functional.mse_loss(model(x), y).item() < loss_before  # it really trains
    trace = diag.load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert (trace.steps["samples"] == 16).all()  # two micro-batches of 8 per step
    assert (trace.steps["forward_us"] > 0).all() and (trace.steps["optimizer_us"] > 0).all()
    assert not diag.session().enabled  # the trainer closed the session it opened


def test_trainer_bfloat16_autocast_on_cpu_and_loader_end(tmp_path):
    model = torch.nn.Linear(16, 1)
    trainer = diag.Trainer(
        model,
        torch.optim.AdamW(model.parameters()),
        torch.nn.functional.mse_loss,
        trace_dir=tmp_path,
        amp_dtype=torch.bfloat16,
        max_grad_norm=1.0,
        session_options={"telemetry": False},
    )
    losses = trainer.fit(make_data(3))  # no max_steps: runs until the loader ends
    assert len(losses) == 3
    trace = diag.load(tmp_path)
    assert len(trace.steps) == 3 and trace.manifest(0).dtype == "bfloat16"
