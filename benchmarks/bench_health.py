"""What training-health tracking costs on the training thread (CPU here; on a GPU the fingerprint is one pass
over the parameters on the device and its value is read back without waiting).

1. The replica fingerprint (every parameter summed in float32, the sums added in float64, diag's ``Session._fingerprint``) of a model of
   ``--width`` (an MLP of ``--layers`` square layers), against one training step of that model (forward,
   backward, SGD step on a batch of ``--batch``), medians of ``--repeats``; and the same amortised over
   ``fingerprint_every`` steps (diag's default).
2. ``diag.record(loss=..., grad_norm=...)`` with 0-d CPU tensors: reading them for the step's row.

usage: python benchmarks/bench_health.py [--width 1024] [--layers 8] [--batch 64] [--repeats 30] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.capture.config import DEFAULT_FINGERPRINT_EVERY  # noqa: E402
from diag.capture.device_timer import host_value  # noqa: E402


def median_s(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    add_json_option(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = [m for _ in range(args.layers) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-4)
    x = torch.randn(args.batch, args.width)

    def train_step():
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    def fingerprint():
        with torch.no_grad():
            return float(torch.stack([p.detach().sum(dtype=torch.float32) for p in params]).double().sum())

    def fingerprint_float64():
        with torch.no_grad():
            return float(torch.stack([p.detach().sum(dtype=torch.float64) for p in params]).sum())

    loss = train_step()
    norm = torch.nn.utils.clip_grad_norm_(params, 1e9)
    step_s = median_s(train_step, args.repeats)
    print_s = median_s(fingerprint, args.repeats)
    print64_s = median_s(fingerprint_float64, args.repeats)
    record_s = median_s(lambda: (host_value(loss), host_value(norm)), args.repeats * 100)
    count = sum(p.numel() for p in params)
    table = Table("health", ["measure", "median"])
    table.add(f"training step ({count / 1e6:.1f} M-parameter MLP, batch {args.batch})", f"{step_s * 1e3:.2f} ms")
    table.add("fingerprint, when taken", f"{print_s * 1e3:.3f} ms ({print_s / step_s:.2%} of a step)")
    table.add("fingerprint summing each parameter in float64 instead", f"{print64_s * 1e3:.3f} ms")
    table.add(
        f"fingerprint every {DEFAULT_FINGERPRINT_EVERY} steps (the default), a step",
        f"{print_s / DEFAULT_FINGERPRINT_EVERY * 1e6:.1f} us ({print_s / DEFAULT_FINGERPRINT_EVERY / step_s:.4%})",
    )
    table.add("`diag.record(loss, grad_norm)` read for the row, a step", f"{record_s * 1e6:.2f} us")
    table.note(f"medians of {args.repeats} (diag.record: of {args.repeats * 100})")
    table.save(args.json)


if __name__ == "__main__":
    main()
