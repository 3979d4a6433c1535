"""One rank of a real megatron-core pipeline-parallel job (``forward_backward_pipelining_without_interleaving``,
one stage per rank, gloo on CPU) adopted with ``diag.instrument(schedules)``, with an optional planted slow stage
(a sleep in its forward). Writes its own step times to TRACE_DIR/truth/rankN.json.

The CPU shim, and why it is this narrow: megatron-core hard-codes CUDA in two places on this path, a token
counter ``torch.zeros(..., device="cuda")`` in the schedules and ``torch.cuda.current_device()`` /
``torch.cuda.synchronize()`` in the p2p communicator (for receive buffers). This machine has no GPU, so only
those two modules' ``torch`` name is replaced by a proxy that maps the CUDA device to the CPU; every other
call (the schedule's logic, autograd, gloo's isend/irecv) is megatron-core and torch unchanged. Where a GPU is
lent, run it without the shim (--no-shim) with NCCL.

usage: megatron_job.py TRACE_DIR --steps N --microbatches M [--slow-stage S --slow-ms MS] [--chunks C]
(--chunks 2: the interleaved schedule, forward_backward_pipelining_with_interleaving, C model chunks per rank)
"""

import argparse
import json
import os
import time
import types

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.pipeline_parallel import p2p_communication, schedules
from megatron.core.transformer import TransformerConfig

import diag

HIDDEN, MICRO_BATCH, SEQ = 32, 4, 8


class _CudaAsCpu(types.ModuleType):
    """``torch`` for megatron's schedules and p2p modules only: CUDA device requests go to the CPU."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(current_device=lambda: "cpu", synchronize=lambda *a: None)

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


class Stage(torch.nn.Module):
    model_type = ModelType.encoder_or_decoder

    def __init__(self, config, first: bool, slow_s: float):
        super().__init__()
        self.config, self.first, self.slow_s = config, first, slow_s
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)
        self.input_tensor = None

    def set_input_tensor(self, tensor):  # megatron hands a non-first stage its received activation here
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x):
        if self.slow_s:
            time.sleep(self.slow_s)  # the planted slow stage
        return torch.relu(self.linear(x if self.first else self.input_tensor))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--slow-stage", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--no-shim", action="store_true")
    parser.add_argument("--chunks", type=int, default=1, help="model chunks per rank; > 1: interleaved schedule")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    if not args.no_shim:
        schedules.torch = p2p_communication.torch = _CudaAsCpu()
    world = dist.get_world_size()
    interleaved = args.chunks > 1
    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=world, virtual_pipeline_model_parallel_size=args.chunks if interleaved else None
    )
    stage = parallel_state.get_pipeline_model_parallel_rank()
    # hidden_size: the activation shape megatron's schedule sends between stages
    config = TransformerConfig(
        num_layers=world * args.chunks,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        pipeline_model_parallel_size=world,
        virtual_pipeline_model_parallel_size=args.chunks if interleaved else None,
        pipeline_dtype=torch.float32,
    )
    torch.manual_seed(stage)
    slow_s = args.slow_ms / 1000 / args.chunks if stage == args.slow_stage else 0.0  # the same plant per micro-batch
    chunks = [Stage(config, stage == 0 and chunk == 0, slow_s) for chunk in range(args.chunks)]
    optimizer = torch.optim.SGD([p for chunk in chunks for p in chunk.parameters()], lr=1e-3)
    schedule = (
        schedules.forward_backward_pipelining_with_interleaving
        if interleaved
        else schedules.forward_backward_pipelining_without_interleaving
    )

    def forward_step_func(data_iterator, model):
        x = next(data_iterator)
        return model(x), lambda output: (output.pow(2).mean(), {})

    diag.init(args.trace_dir, telemetry=False)
    diag.instrument(schedules)
    step_times_s = []
    for _ in range(args.steps):
        data = [iter([torch.randn(SEQ, MICRO_BATCH, HIDDEN) for _ in range(args.microbatches)]) for _ in chunks]
        start = time.perf_counter()
        with diag.step():
            schedule(
                forward_step_func=forward_step_func,
                data_iterator=data if interleaved else data[0],
                model=chunks,
                num_microbatches=args.microbatches,
                seq_length=SEQ,
                micro_batch_size=MICRO_BATCH,
            )
            optimizer.step()
            optimizer.zero_grad()
        step_times_s.append(time.perf_counter() - start)
    diag.finish()
    os.makedirs(os.path.join(args.trace_dir, "truth"), exist_ok=True)
    with open(os.path.join(args.trace_dir, "truth", f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"steps": len(step_times_s), "step_times_s": step_times_s, "stage": stage}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
