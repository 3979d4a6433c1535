"""What the opt-in deep memory mode costs a step, and that it costs nothing when off.

One process, CPU, one thread, a GPT-like model (``bench_memory_categories.gpt``: 4 layers, d_model 256, 4 heads,
vocabulary 4096; micro-batch 4 x 64 tokens) with AdamW, under a real diag session each time:

* ``off``: ``diag.init`` without ``memory_deep_steps`` (the default): step times;
* ``on``: ``memory_deep_steps=(WARMUP, DEEP)``: the recorded steps' times (the last one includes converting and
  writing memory_deep.json), and the steps after them, which only pay the mode's ``is None``-cheap checks;
* the two checks a step makes when the mode is configured but the step is not chosen, timed alone.

The sessions alternate (off, on, off, on, ...) so the shared machine's load falls on both alike. With
``--device cuda`` the same model runs on the GPU (each step ends with a device synchronise so its wall time is the
step's), where the recorded steps also keep CUDA's allocator history (torch's ~2 us per allocation by its
documentation) and memory_deep.json holds the allocator's segments.

Printed as a table (``record.Table``; ``--json PATH`` saves it): the median step of each kind, the checks'
nanoseconds and memory_deep.json's size as notes.

usage: python benchmarks/bench_memory_deep.py [--rounds 3] [--steps 20] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Table, add_json_option  # noqa: E402

WARMUP, DEEP = 3, 5


def run_session(trace_dir: str, steps: int, deep: bool, device: str = "cpu") -> list[float]:
    """Step times (ms) of one real session."""
    import torch
    from bench_memory_categories import gpt

    import diag

    torch.manual_seed(0)
    model = gpt(layers=4, d_model=256, heads=4, vocab=4096).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 4096, (4, 65), device=device)
    options = {"memory_deep_steps": (WARMUP, DEEP)} if deep else {}
    diag.init(trace_dir, telemetry=False, watchdog=False, clock_sync=False, collectives=False, **options)
    diag.instrument(model, optimizer)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with diag.step():
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4096), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if device == "cuda":
                torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    diag.finish()
    return times


def unchosen_step_checks_ns(iterations: int) -> float:
    """ns for step_begin + step_end of a step outside the chosen ones (the mode configured, not recording)."""
    import torch

    from diag.capture.memory_deep import DeepMemory

    deep = DeepMemory(None, torch.device("cpu"), None, 10**9, 1)
    start = time.perf_counter_ns()
    for step in range(iterations):
        deep.step_begin(step)
        deep.step_end(step)
    return (time.perf_counter_ns() - start) / iterations


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    add_json_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    off, deep_steps, after = [], [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as d:
            off += run_session(d, args.steps, deep=False, device=args.device)[WARMUP:]
        with tempfile.TemporaryDirectory() as d:
            times = run_session(d, args.steps, deep=True, device=args.device)
            deep_steps += times[WARMUP : WARMUP + DEEP]
            after += times[WARMUP + DEEP :]
            size = (Path(d) / "rank00000" / "memory_deep.json").stat().st_size
    median_off = statistics.median(off)
    median_deep = statistics.median(deep_steps)
    table = Table("memory_deep", ["step", f"median step on {args.device} (ms)"])
    table.add("off (the default)", f"{median_off:.2f}")
    table.add(
        "recorded steps (the last one converts and writes memory_deep.json)",
        f"{median_deep:.2f} ({median_deep / median_off:.2f}x)",
    )
    table.add("steps after the recorded ones, same session", f"{statistics.median(after):.2f}")
    table.note(
        f"a step not chosen, mode configured: the two checks it makes, {unchosen_step_checks_ns(200_000):.0f} ns "
        f"(mean of 200,000)"
    )
    table.note(
        f"{args.rounds} rounds of {args.steps} steps, off and on alternately, the first {WARMUP} steps of each session "
        f"left out; steps measured: {len(off)} off, {len(deep_steps)} recorded, {len(after)} after; "
        f"memory_deep.json {size:,} bytes"
    )
    table.save(args.json)


if __name__ == "__main__":
    main()
