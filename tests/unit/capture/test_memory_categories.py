"""Memory by category (parameters, gradients, optimizer state) from real 2-rank gloo runs, against the true
tensor sizes worked out here from the model's shapes and each framework's sharding rule, independently of how
capture walks the tensors: DDP (full copies), FSDP2 (fully_shard: dim-0 shards padded to equal size, optimizer
state on the unpadded shard) and DeepSpeed ZeRO-2 (flat buffer; gradients and fp32 master weights partitioned)."""

from __future__ import annotations

import math

import pytest

import diag
from diag.analysis.report import analyze

WORLD, STEPS = 2, 6


def numel(shape) -> int:
    return math.prod(shape)


def test_a_model_the_walk_cannot_count_gives_one_warning_and_the_rows_go_on(tmp_path):
    import warnings

    import torch

    from diag._warn import DiagWarning

    class Moved(torch.nn.Linear):
        """A module whose parameters cannot be listed any more once training runs (a stand-in for a layout the
        walk does not understand)."""

        broken = False

        def parameters(self, recurse: bool = True):
            if self.broken:
                raise RuntimeError("parameters moved elsewhere")
            return super().parameters(recurse)

    model = Moved(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(tmp_path, telemetry=False, watchdog=False)
    diag.instrument(model, optimizer)
    model.broken = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with diag.step():
                model(torch.randn(2, 4)).sum().backward()
                optimizer.step()
    diag.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert len(messages) == 1 and "parameters moved elsewhere" in messages[0]
    memory = diag.load(tmp_path).memory
    assert memory["step"].tolist() == [0, 1, 2] and memory["param_bytes"].isna().all()


def test_a_model_shape_given_to_init_gives_the_report_its_activation_prediction(tmp_path):
    import torch

    shape = {"micro_batch": 2, "seq_len": 16, "hidden": 32, "layers": 2, "heads": 4}
    with pytest.raises(ValueError, match="model_shape"):
        diag.init(tmp_path / "bad", model_shape={**shape, "hidden": 0})
    with pytest.raises(ValueError, match="unknown keys"):
        diag.init(tmp_path / "bad", model_shape={"hiden": 32})
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.init(tmp_path, telemetry=False, watchdog=False, model_shape=shape)
    diag.instrument(model, optimizer)
    for _ in range(3):
        with diag.step():
            model(torch.randn(2, 16, 32)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    trace = diag.load(tmp_path)
    assert trace.manifests[0].model_shape.hidden == 32
    rows = {r.category: r for r in analyze(trace).memory.plan.rows}
    sbh = 16 * 2 * 32
    assert rows["activation_bytes"].predicted_bytes == pytest.approx(2 * sbh * (34 + 5 * 4 * 16 / 32))
    assert rows["activation_bytes"].measured_bytes is None  # no CUDA allocator on this run
    params = sum(p.numel() for p in model.parameters())
    assert rows["param_bytes"].predicted_bytes == rows["param_bytes"].measured_bytes == 4 * params
