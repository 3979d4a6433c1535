"""A real training job whose memory categories the tests check against the true tensor sizes.

usage: memory_job.py TRACE_DIR MODE STEPS   (MODE: ddp, fsdp2, deepspeed-zero2, oom)

ddp, fsdp2, deepspeed-zero2: the same small model (Linear 64x64, ReLU, Linear 64x64, Linear 64x1), AdamW (DeepSpeed:
its torch Adam), one batch of 8 a step. oom: two pipeline-like stages without DDP, rank 1 also holding an output
head of vocabulary 4096, and rank 1's forward at step OOM_STEP asks the CPU allocator for 2**50 bytes: a real
allocator failure that diag records as an OOM.
"""

import sys

import torch
import torch.distributed as dist

import diag

HIDDEN, VOCAB, OOM_STEP = 64, 4096, 3
trace_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def net():
    return torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    )


def batch():
    x = torch.randn(8, HIDDEN)
    return x, x.sum(dim=1, keepdim=True)


diag.init(trace_dir, telemetry=False, watchdog=False)
if mode == "deepspeed-zero2":
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
    }
    model = net()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    diag.instrument(engine, optimizer)
    for _ in range(steps):
        with diag.step():
            x, y = batch()
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()
elif mode in ("ddp", "fsdp2"):
    model = net()
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.instrument(model, optimizer)
    for _ in range(steps):
        with diag.step():
            x, y = batch()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
elif mode == "oom":

    class Stage(torch.nn.Module):
        def __init__(self, last: bool):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU())
            self.head = torch.nn.Linear(HIDDEN, VOCAB) if last else None
            self.step = 0

        def forward(self, x):
            x = self.body(x)
            if self.head is None:
                return x
            if self.step == OOM_STEP:  # logits for a batch far too large: the allocator cannot give it
                torch.empty(2**50, dtype=torch.uint8)
            return self.head(x)

    model = Stage(last=rank == 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.instrument(model, optimizer)
    for step in range(steps):
        model.step = step
        try:
            with diag.step():
                x, _ = batch()
                model(x).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        except RuntimeError as exc:
            print("step failed:", str(exc)[:80], flush=True)
diag.finish()
dist.barrier()
dist.destroy_process_group()
