"""Make the bundled sample run ``sample_traces/straggler/``: a real 3-rank CPU job (gloo, DDP) captured by
diag, with a compute straggler planted at rank 1 (an extra matrix-multiply loop inside its step).

    python sample_traces/make_samples.py            # rewrites sample_traces/straggler/
    diag analyze                                    # analyses it

``sample_traces/straggler-h100/`` is the same job (30 steps, +40 ms on rank 1) with all three ranks on one
NVIDIA H100 80GB HBM3 (DIAG_JOB_DEVICE=cuda, gloo), recorded once on a GPU machine: real CUDA timings, NVML
telemetry and allocator statistics for tests that run without a GPU. ``sample_traces/straggler-h200/`` is the
same again (30 steps) on one NVIDIA H200, in schema 2 (columnar) with the deep memory mode at steps 5-6 (CUDA's
allocator history): ``DIAG_JOB_TRACE_FORMAT=2 DIAG_JOB_MEMORY_DEEP=5,2``, recorded by ``benchmarks/gpu_checks.sh
sample``.

The same script is the job the analysis tests run (``job`` sub-command; DIAG_JOB_DEVICE=cuda puts every rank
on the GPU, still over gloo so that several ranks can share one GPU):

    make_samples.py job TRACE_DIR STEPS SLOW_RANK {compute,data,none} EXTRA_MS
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLD = 3
STEPS = 40
SLOW_RANK = 1
EXTRA_MS = 40.0


def busy_compute(ms: float, torch, device) -> None:
    """Real work (not sleep) for about ``ms`` milliseconds: what a rank with more to compute does."""
    a = torch.randn(96 if device.type == "cpu" else 2048, 96 if device.type == "cpu" else 2048, device=device)
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def slow_batches(batches, delay_ms: float):
    """A data loader that takes ``delay_ms`` to produce each batch (slow storage or decoding)."""
    for batch in batches:
        time.sleep(delay_ms / 1e3)
        yield batch


def job(trace_dir: str, steps: int, slow_rank: int, mode: str, extra_ms: float) -> None:
    import torch
    import torch.distributed as dist

    import diag

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device(os.environ.get("DIAG_JOB_DEVICE", "cpu"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(device)
    batch_size = 64
    flops = 6 * sum(p.numel() for p in model.parameters()) * batch_size  # forward + backward of the weights
    gpu = device.type == "cuda"
    # a GPU recording may ask for the columnar schema and the deep memory mode ("START,COUNT" steps)
    options = {"trace_format": int(os.environ.get("DIAG_JOB_TRACE_FORMAT", 1))}
    if os.environ.get("DIAG_JOB_MEMORY_DEEP"):
        options["memory_deep_steps"] = tuple(int(n) for n in os.environ["DIAG_JOB_MEMORY_DEEP"].split(","))
    diag.init(
        trace_dir,
        flops_per_step=flops,
        dtype="float32",
        telemetry=gpu,
        telemetry_interval_s=0.1,
        watchdog=False,
        **options,
    )
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    batches = [torch.randn(batch_size, 256, device=device) for _ in range(steps)]
    loader = slow_batches(batches, extra_ms) if mode == "data" and rank == slow_rank else batches
    for batch in diag.wrap_loader(loader):
        with diag.step(samples=batch_size):
            busy_compute(15.0, torch, device)  # the model's "real" work, so timings are not all noise
            if mode == "compute" and rank == slow_rank:
                busy_compute(extra_ms, torch, device)
            loss = model(batch).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    dist.destroy_process_group()


def make_sample(out: Path = HERE / "straggler") -> None:
    from diag.launch import run_ranks

    tmp = out.with_name(out.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    results = run_ranks(
        [__file__, "job", str(tmp), str(STEPS), str(SLOW_RANK), "compute", str(EXTRA_MS)], WORLD, timeout_s=300
    )
    for result in results:
        if result.returncode != 0:
            sys.exit(f"rank {result.rank} failed:\n{result.stderr[-3000:]}")
    shutil.rmtree(tmp / ".diag-cache", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"wrote {out}: {WORLD} ranks, {STEPS} steps, compute straggler at rank {SLOW_RANK} (+{EXTRA_MS:.0f} ms/step)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        trace_dir, steps, slow_rank, mode, extra_ms = sys.argv[2:7]
        job(trace_dir, int(steps), int(slow_rank), mode, float(extra_ms))
    else:
        make_sample()
