"""Optimizer state held by a container of optimizers (torchtitan's ``OptimizersContainer``): counted, and the
manifest names the optimizer inside. The container here has the shape of torchtitan's: a
``torch.optim.Optimizer`` over every parameter (for its step hooks) whose own ``state`` stays empty, the real
optimizers in ``.optimizers``."""

import torch

from diag.capture.memory_categories import MemoryCategories, describe_model


class Container(torch.optim.Optimizer):
    def __init__(self, optimizers):
        self.optimizers = optimizers
        super().__init__([p for o in optimizers for g in o.param_groups for p in g["params"]], {})

    def step(self, closure=None):
        for optimizer in self.optimizers:
            optimizer.step()


def trained(model, optimizer):
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()


def test_state_of_the_held_optimizers_is_counted_once():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    adam = torch.optim.AdamW(model[0].parameters())
    sgd = torch.optim.SGD(model[1].parameters(), momentum=0.9)
    container = Container([adam, sgd])
    trained(model, container)
    assert not container.state  # the container's own state: empty, as torchtitan's

    categories = MemoryCategories(torch.device("cpu"))
    categories.add_module(model)
    categories.add_optimizer(container)
    categories.measure(step=0)
    params_0 = sum(p.numel() * 4 for p in model[0].parameters())
    params_1 = sum(p.numel() * 4 for p in model[1].parameters())
    # AdamW: exp_avg and exp_avg_sq (and a 4-byte step each); SGD: a momentum buffer
    steps = 4 * len(list(model[0].parameters()))
    assert categories.optimizer_state_bytes == 2 * params_0 + steps + params_1
    assert categories.param_bytes == params_0 + params_1

    # the container and a held optimizer both instrumented: each tensor still once
    categories.add_optimizer(adam)
    categories.measure(step=1)
    assert categories.optimizer_state_bytes == 2 * params_0 + steps + params_1


def test_manifest_names_the_held_optimizer():
    model = torch.nn.Linear(8, 1)
    assert describe_model([model], [Container([torch.optim.AdamW(model.parameters())])])["optimizer"] == "AdamW"
    assert describe_model([model], [torch.optim.SGD(model.parameters())])["optimizer"] == "SGD"
