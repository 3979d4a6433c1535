"""What ``diag.init(nvtx=True)`` costs: one NVTX range (start and end) on the host, and what the ranges add to a
real step (diag with nvtx on against diag with it off, step by step as in bench_capture.py).

Needs a torch build with NVTX (a CUDA build); on a CPU build it says so and stops (the option turns itself off
there). The real step is bench_capture.py's one-rank DDP model on the CPU: NVTX ranges are host-side calls.

usage: python benchmarks/bench_nvtx.py [--iterations 100000] [--range-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def nvtx_available() -> bool:
    import torch.cuda.nvtx as nvtx

    try:
        nvtx.range_end(nvtx.range_start("probe"))
        return True
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=100_000)
    # on a GPU, bench_capture_gpu.py --real-step --breakdown measures the ranges in a real GPU step
    parser.add_argument("--range-only", action="store_true", help="only one range's host cost")
    args = parser.parse_args()
    import torch
    import torch.cuda.nvtx as nvtx
    import torch.distributed as dist
    from bench_capture import cost_in_a_real_step, timed

    from diag.launch import free_port
    from diag.trace.writer import DEFAULT_TRACE_FORMAT

    empty_ns = timed(lambda: None, args.iterations)
    if not nvtx_available():
        print(f"torch {torch.__version__}: no NVTX in this build; nvtx=True turns itself off (one warning)")
        return
    range_ns = timed(lambda: nvtx.range_end(nvtx.range_start("diag.step 0")), args.iterations) - empty_ns
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    print(f"one NVTX range (range_start + range_end), host: {range_ns / 1000:.3f} us (median of {args.iterations})")
    if args.range_only:
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    with tempfile.TemporaryDirectory() as tmp:
        on_us, a_a_us, _ = cost_in_a_real_step(Path(tmp), DEFAULT_TRACE_FORMAT, nvtx=True)
        off_us, *_ = cost_in_a_real_step(Path(tmp), DEFAULT_TRACE_FORMAT, with_a_a=False, nvtx=False)
    print(
        f"diag's cost in a real step (one-rank DDP, step by step against plain): nvtx on {on_us:.1f} us, "
        f"off {off_us:.1f} us (A/A: {a_a_us:.1f} us)"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
