"""Host cost of diag's step span on a GPU (CUDA events, allocator statistics), and of its parts.

usage (on a machine with an NVIDIA GPU): python benchmarks/bench_capture_gpu.py
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import diag  # noqa: E402
from diag.capture.memory import _allocator_stats  # noqa: E402


def median_us(function, iterations: int = 5000) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        function()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def step_once(work) -> None:
    with diag.step():
        work()


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    device = torch.device("cuda", 0)
    x = torch.randn(256, 256, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        diag.init(tmp, telemetry=False, watchdog=False)
        for label, work in (("empty step", lambda: None), ("step with a 256x256 matmul", lambda: x @ x)):
            spanned, plain = median_us(lambda w=work: step_once(w)), median_us(work)
            print(f"{label}: {spanned:.1f} us with diag.step(), {plain:.1f} us plain -> {spanned - plain:.1f} us added")
        print(
            f"parts: torch.cuda.memory_stats() {median_us(lambda: torch.cuda.memory_stats(device)):.1f} us, "
            f"raw allocator stats {median_us(lambda: _allocator_stats(torch, device)):.1f} us, "
            f"reset_peak_memory_stats {median_us(lambda: torch.cuda.reset_peak_memory_stats(device)):.1f} us, "
            f"CUDA event create+record {median_us(lambda: torch.cuda.Event(enable_timing=True).record()):.1f} us"
        )
        diag.finish()


if __name__ == "__main__":
    main()
