"""What counting memory by category (parameters, gradients, optimizer state) costs the training thread.

Per step diag reads the memory row at the step's end; with a model and optimizer instrumented it also counts
the categories, but only at the first three steps and every 50th (diag/capture/memory_categories.py). Measured
in one process on CPU, for two models with AdamW after one real step (so Adam's state exists):

* ``mlp``: bench_capture.py's 3-layer MLP of width 900 (6 tensors);
* ``gpt``: a 12-layer GPT-like model (d_model 512, 8 heads, vocabulary 8192; 146 tensors).

Reported, in microseconds (medians): a memory row without categories and with them on a step that is not
measured (the figure every step pays), the backward-end hook on such a step, one full measurement (parameters
and optimizer state at the step's end, gradients at the backward's end) and the cost per step averaged over the
first 1,000 steps (22 measured steps).

usage: python benchmarks/bench_memory_categories.py [--iterations 20000] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import Table, add_json_option  # noqa: E402

MODELS = {"mlp": "MLP", "gpt": "GPT-like"}


def mlp():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(900, 900), torch.nn.ReLU(), torch.nn.Linear(900, 900), torch.nn.ReLU(), torch.nn.Linear(900, 1)
    )


def gpt(layers: int = 12, d_model: int = 512, heads: int = 8, vocab: int = 8192):
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d_model)
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True) for _ in range(layers)
            )
            self.head = torch.nn.Linear(d_model, vocab, bias=False)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Model()


def one_step(model, name: str):
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 900) if name == "mlp" else torch.randint(0, 8192, (2, 16))
    model(x).float().mean().backward()
    optimizer.step()
    model(x).float().mean().backward()  # gradients present, as at a backward's end
    return optimizer


def median_us(function, iterations: int) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        function()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def measure(name: str, model, iterations: int) -> dict:
    import torch

    from diag.capture.memory import MemorySampler
    from diag.capture.memory_categories import MEASURE_EVERY_STEPS, MEASURE_FIRST_STEPS

    optimizer = one_step(model, name)
    device = torch.device("cpu")
    plain, tracked = MemorySampler(device), MemorySampler(device)
    tracked.categories.add_module(model)
    tracked.categories.add_optimizer(optimizer)
    not_due = MEASURE_FIRST_STEPS + 1  # a step that is not measured
    row_plain = median_us(lambda: plain.sample(not_due), iterations)
    row_tracked = median_us(lambda: tracked.sample(not_due), iterations)
    backward_end = median_us(lambda: tracked.categories.on_backward_end(not_due), iterations)
    full = median_us(lambda: tracked.categories.measure(0), max(iterations // 20, 200))
    gradients = median_us(tracked.categories.gradient_bytes, max(iterations // 20, 200))
    steps = 1000
    measured = sum(tracked.categories.due(s) for s in range(steps))
    per_step = (row_tracked - row_plain) + backward_end + measured * full / steps
    return {
        "model": name,
        "tensors": sum(1 for _ in model.parameters()),
        "row_without_categories_us": round(row_plain, 2),
        "row_with_categories_not_measured_us": round(row_tracked, 2),
        "backward_end_not_measured_us": round(backward_end, 2),
        "one_measurement_us": round(full, 1),
        "of_which_gradients_us": round(gradients, 1),
        "measured_steps_of_1000": measured,
        "average_per_step_first_1000_us": round(per_step, 2),
        "every_n_steps": MEASURE_EVERY_STEPS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    add_json_option(parser)
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    table = Table(
        "memory_categories",
        [
            "model",
            "row without / with categories, step not measured",
            "backward-end hook, not measured",
            "one measurement (of which gradients)",
            "average per step, first 1,000 steps",
        ],
    )
    results = []
    for name, model in (("mlp", mlp()), ("gpt", gpt())):
        r = measure(name, model, args.iterations)
        results.append(r)
        table.add(
            f"{MODELS[name]}, {r['tensors']} tensors",
            f"{r['row_without_categories_us']:.2f} / {r['row_with_categories_not_measured_us']:.2f} us",
            f"{r['backward_end_not_measured_us']:.2f} us",
            f"{r['one_measurement_us']:g} us ({r['of_which_gradients_us']:g})",
            f"{r['average_per_step_first_1000_us']:.2f} us",
        )
    not_measured = ", ".join(
        f"{MODELS[r['model']]} {r['row_with_categories_not_measured_us'] - r['row_without_categories_us'] + r['backward_end_not_measured_us']:.2f} us"
        for r in results
    )
    per_tensor = ", ".join(f"{MODELS[r['model']]} {r['one_measurement_us'] / r['tensors']:.1f} us" for r in results)
    table.note(
        f"medians of {args.iterations:,} calls (a measurement: of {max(args.iterations // 20, 200):,}); "
        f"{results[0]['measured_steps_of_1000']} of the first 1,000 steps are measured"
    )
    table.note(f"what categories add to a step that is not measured (row and hook): {not_measured}")
    table.note(f"one measurement per parameter tensor (its gradient and optimizer state included): {per_tensor}")
    table.save(args.json)


if __name__ == "__main__":
    main()
