"""A small DDP job (gloo, CPU) captured by diag, with the knobs the comparison tests turn between two runs.

usage: compare_job.py TRACE_DIR [--steps N] [--width W] [--depth D] [--batch B] [--work-ms MS] [--data-sleep-ms MS]
                      [--bucket-cap-mb MB] [--dtype NAME]

* ``--width``, ``--depth``: the MLP's hidden width and number of hidden layers (a larger model: more compute
  per step; more layers: more gradient tensors, so more DDP buckets when buckets are small).
* ``--work-ms``: a sleep inside the step body standing for the model's "real" work, so that 4 ranks on 2 cores
  still keep time (as tests/analysis/straggler_job.py does).
* ``--data-sleep-ms``: every rank's data loader sleeps this long before each batch (a planted slow loader).
* ``--bucket-cap-mb``: DDP's bucket size (small: many all_reduce buckets a step).
* ``--batch``: samples per rank per step (recorded with ``diag.step(samples=...)``).
* ``--calibrate-every``: steps between diag's machine-speed calibrations (diag.init's ``calibrate_every``).
* ``--compute-repeats``: the model's forward and backward run this many times a step (a planted regression in
  compute that the machine's load slows as it slows the rest: 2 is twice the compute).

Rank 0 prints, as JSON, each step's wall-clock time measured here with perf_counter (not by diag).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

import diag


def batches(n: int, batch: int, sleep_ms: float):
    """A data loader that takes ``sleep_ms`` to produce each batch."""
    for _ in range(n):
        if sleep_ms:
            time.sleep(sleep_ms / 1e3)
        yield torch.randn(batch, 64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--data-sleep-ms", type=float, default=0.0)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calibrate-every", type=int, default=None)
    parser.add_argument("--compute-repeats", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    w = args.width
    hidden = [layer for _ in range(args.depth) for layer in (torch.nn.Linear(w, w), torch.nn.ReLU())]
    model = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), *hidden, torch.nn.Linear(w, 4))
    n_params = sum(p.numel() for p in model.parameters())
    diag.init(
        args.trace_dir,
        telemetry=False,
        hang_threshold_s=300,
        flops_per_step=6.0 * n_params * args.batch,
        dtype=args.dtype,
        parallel={"dp": dist.get_world_size()},
        **({} if args.calibrate_every is None else {"calibrate_every": args.calibrate_every}),
    )
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    step_s = []
    for batch in diag.wrap_loader(batches(args.steps, args.batch, args.data_sleep_ms)):
        started = time.perf_counter()
        with diag.step(samples=len(batch)):
            if args.work_ms:
                time.sleep(args.work_ms / 1e3)
            for _ in range(args.compute_repeats - 1):  # extra compute, without DDP's all_reduce
                with model.no_sync():
                    model(batch).square().mean().backward()
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        step_s.append(time.perf_counter() - started)
    diag.finish()
    if rank == 0:
        print(json.dumps({"step_s": step_s}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
