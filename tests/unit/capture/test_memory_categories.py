"""Memory by category (parameters, gradients, optimizer state) from real 2-rank gloo runs, against the true
tensor sizes worked out here from the model's shapes and each framework's sharding rule, independently of how
capture walks the tensors: DDP (full copies), FSDP2 (fully_shard: dim-0 shards padded to equal size, optimizer
state on the unpadded shard) and DeepSpeed ZeRO-2 (flat buffer; gradients and fp32 master weights partitioned)."""

from __future__ import annotations

import diag

WORLD, STEPS = 2, 6


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
