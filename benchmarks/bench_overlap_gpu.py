"""Does diag keep a collective overlapping the compute it was issued beside? On one GPU, a one-rank NCCL group:
an ``all_gather_into_tensor`` of 1 GiB (one rank: a device copy on NCCL's own stream) is issued with
``async_op=True``, then matmuls run on the default stream, then the collective is waited for. The share of the
collective's time hidden behind the compute, ``(compute + collective - both) / collective`` from median
iteration times, with and without diag, and with the settings known to serialise communication with compute
(``TORCH_NCCL_ENABLE_TIMING=1`` with ``CUDA_DEVICE_MAX_CONNECTIONS=1``, pytorch#143890). Each configuration is
its own process: the environment is read when CUDA starts.

usage (on a machine with an NVIDIA GPU): python benchmarks/bench_overlap_gpu.py [--iterations 30] [--json PATH]
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (  # (name, diag on, environment)
    ("plain", False, {}),
    ("diag", True, {}),
    ("plain, NCCL timing", False, {"TORCH_NCCL_ENABLE_TIMING": "1"}),
    ("diag, NCCL timing", True, {"TORCH_NCCL_ENABLE_TIMING": "1"}),
    ("plain, NCCL timing, 1 connection", False, {"TORCH_NCCL_ENABLE_TIMING": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    ("diag, NCCL timing, 1 connection", True, {"TORCH_NCCL_ENABLE_TIMING": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
)
GATHER_BYTES = 1 << 30
MATMULS, MATMUL_N = 24, 4096


def measure(with_diag: bool, iterations: int) -> dict:
    """Median seconds of an iteration of the compute alone, the collective alone, and both (one process)."""
    import torch
    import torch.distributed as dist

    import diag

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    source = torch.empty(GATHER_BYTES, dtype=torch.uint8, device="cuda")
    gathered = torch.empty_like(source)
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    if with_diag:
        diag.init(tempfile.mkdtemp(prefix="overlap-"), telemetry=False)

    def iteration(compute: bool, collective: bool) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with diag.step() if with_diag else contextlib.nullcontext():
            work = dist.all_gather_into_tensor(gathered, source, async_op=True) if collective else None
            if compute:
                for _ in range(MATMULS):
                    a @ a
            if work is not None:
                work.wait()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    times = {"compute": [], "collective": [], "both": []}
    for _ in range(3):  # warm-up: NCCL's communicator, cuBLAS' handles
        iteration(True, True)
    for _ in range(iterations):  # interleaved: the GPU's clocks drift alike for all three
        times["compute"].append(iteration(True, False))
        times["collective"].append(iteration(False, True))
        times["both"].append(iteration(True, True))
    if with_diag:
        diag.finish()
    dist.destroy_process_group()
    return {name: statistics.median(samples) for name, samples in times.items()}


def hidden_share(medians: dict) -> float:
    return (medians["compute"] + medians["collective"] - medians["both"]) / medians["collective"]


def run_config(with_diag: bool, env: dict, iterations: int) -> dict:
    child_env = {**os.environ, **env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, __file__, "--child", "1" if with_diag else "0", "--iterations", str(iterations)]
    result = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"configuration failed: {env}, diag {with_diag}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child == "1", args.iterations)))
        return
    rows = []
    print("| configuration | compute ms | collective ms | both ms | collective hidden |")
    print("|---|---|---|---|---|")
    for name, with_diag, env in CONFIGS:
        medians = run_config(with_diag, env, args.iterations)
        row = {
            "configuration": name,
            **{f"{k}_ms": v * 1000 for k, v in medians.items()},
            "hidden": hidden_share(medians),
        }
        rows.append(row)
        print(
            f"| {name} | {row['compute_ms']:.2f} | {row['collective_ms']:.2f} | {row['both_ms']:.2f} | "
            f"{row['hidden']:.0%} |",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
