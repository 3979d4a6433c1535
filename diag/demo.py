"""A small multi-rank CPU training job with diag capture on: the README's first command runs it.

Each rank trains a small MLP under DDP (gloo) on synthetic data. Options plant problems at known ranks
so that the analyses have something to find: ``--slow-rank`` does extra compute, ``--slow-data-rank``
has a slow data loader.
"""

from __future__ import annotations

import argparse
import time


def _loader(steps: int, batch_size: int, features: int, delay_s: float, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if delay_s:
            time.sleep(delay_s)  # a slow input pipeline: decoding, augmentation, remote storage
        yield torch.randn(batch_size, features, generator=generator), torch.randn(batch_size, 1, generator=generator)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import diag

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    hidden = args.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(args.features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )
    params = sum(p.numel() for p in model.parameters())
    # 6 FLOPs per parameter per sample (forward 2, backward 4) for a dense MLP
    diag.init(
        args.trace_dir,
        flops_per_step=6 * params * args.batch_size,
        dtype="float32",
        parallel={"dp": dist.get_world_size()},
    )
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.instrument(model, optimizer)
    extra = torch.randn(args.hidden, args.hidden)
    data_delay_s = args.data_delay_s if rank == args.slow_data_rank else 0.0
    for inputs, targets in diag.wrap_loader(_loader(args.steps, args.batch_size, args.features, data_delay_s, rank)):
        with diag.step(samples=args.batch_size):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            if rank == args.slow_rank:
                with diag.phase("extra_compute"):
                    for _ in range(args.slow_factor):
                        extra = torch.tanh(extra @ extra.T / hidden)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    diag.finish()
    dist.destroy_process_group()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=int, default=6, help="extra matmuls per step on --slow-rank")
    parser.add_argument("--slow-data-rank", type=int, default=-1)
    parser.add_argument("--data-delay-s", type=float, default=0.02)
    return parser.parse_args(argv)


if __name__ == "__main__":
    worker(parse_args())
