"""One rank of a small real training job of the framework named by --framework, adopted exactly as
docs/frameworks.md says, with an optional planted slow rank (a sleep in its forward). Writes what it did
(steps, step times it measured itself, parameter bytes) to TRACE_DIR/truth/rankN.json.

usage: job.py TRACE_DIR --framework NAME --steps N [--slow-rank R --slow-ms MS]
Ranks are started with torchrun's variables (diag.launch.run_ranks); gloo on CPU.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import diag
from diag.capture.flight_recorder import own_dump

HIDDEN = 64
RESTORED = {}  # framework -> whether diag.finish() put its objects back as they were
WINDOWS_NS = []  # [start, end] of each step, time.time_ns(), to place Flight Recorder's entries in steps
ACCUMULATE = 2  # micro-batches per optimizer update in the accumulating rows
COUNTED_PER_STEP = []  # Flight Recorder's collectives of each step, counted right after it (a small ring)


class Net(torch.nn.Module):
    def __init__(self, slow_s: float):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.ReLU(),
            torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.Linear(HIDDEN, 1),
        )
        self.slow_s = slow_s

    def forward(self, x):
        if self.slow_s:
            time.sleep(self.slow_s)  # the planted straggler: compute in this rank's forward
        return self.layers(x)


def batches(steps: int, rank: int):
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, HIDDEN, generator=generator)
        yield x, x.sum(dim=1, keepdim=True)


def run_deepspeed(args, model, rank):
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": int(args.framework[-1])},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    diag.instrument(engine, optimizer)

    def train_step(batch):
        x, y = batch
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()

    step_times_s = timed_steps(diag.wrap_loader(batches(args.steps, rank)), train_step)
    diag.finish()  # diag's wrappers leave the engine: its methods are the class's again
    RESTORED["deepspeed"] = not ({"backward", "step"} & set(vars(engine))) and "step" not in vars(optimizer)
    return step_times_s


def run_deepspeed_accumulating(args, model, rank):
    """DeepSpeed ZeRO-1 accumulating gradients over 2 micro-batches, with diag's steps at the accumulation
    boundary (``step_at``): the loop has no diag.step(); one diag step per optimizer update."""
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": ACCUMULATE,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    diag.instrument(engine, optimizer, step_at="accumulation_boundary")
    micro = list(batches(args.steps * ACCUMULATE, rank))
    step_times_s = []
    for update in range(args.steps):
        start = time.perf_counter()
        WINDOWS_NS.append([time.time_ns(), None])
        for x, y in micro[update * ACCUMULATE : (update + 1) * ACCUMULATE]:
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()  # an update only at the accumulation boundary
        WINDOWS_NS[-1][1] = time.time_ns()
        step_times_s.append(time.perf_counter() - start)
    diag.finish()
    RESTORED["deepspeed"] = not ({"backward", "step"} & set(vars(engine))) and "step" not in vars(optimizer)
    return step_times_s


def run_megatron_tp(args, model, rank):
    """megatron-core tensor parallelism: a ColumnParallelLinear then a RowParallelLinear over every rank
    (tensor_model_parallel_size = world), every rank fed the same batches as TP needs. No CUDA shim: on this
    path megatron-core calls only torch.distributed (its all_reduces are ordinary collectives)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig

    world = dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        tensor_model_parallel_size=world,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        gradient_accumulation_fusion=False,
    )
    init = torch.nn.init.xavier_normal_

    class TensorParallelNet(torch.nn.Module):
        def __init__(self, slow_s: float):
            super().__init__()
            self.column = ColumnParallelLinear(
                HIDDEN, 2 * HIDDEN, config=config, init_method=init, gather_output=False, bias=True
            )
            self.row = RowParallelLinear(
                2 * HIDDEN,
                HIDDEN,
                config=config,
                init_method=init,
                input_is_parallel=True,
                skip_bias_add=False,
                bias=True,
            )
            self.head = torch.nn.Linear(HIDDEN, 1)
            self.slow_s = slow_s

        def forward(self, x):
            if self.slow_s:
                time.sleep(self.slow_s)  # the planted straggler, as in Net
            hidden, _ = self.column(x)
            out, _ = self.row(torch.relu(hidden))
            return self.head(out)

    return train_model(TensorParallelNet(model.slow_s), batches(args.steps, 0))


def run_accelerate(args, model, rank):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    diag.instrument(model, optimizer)

    def train_step(batch):
        x, y = batch
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    return timed_steps(diag.wrap_loader(batches(args.steps, rank)), train_step)


def run_ddp(args, model, rank):
    return train_model(torch.nn.parallel.DistributedDataParallel(model), batches(args.steps, rank))


def train_model(model, batches_, after_step=None) -> list[float]:
    """The plain loop of a wrapped model (DDP, tensor parallel): AdamW, instrumented as docs/frameworks.md
    says, one batch a step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.instrument(model, optimizer)

    def train_step(batch):
        x, y = batch
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return timed_steps(diag.wrap_loader(batches_), train_step, after_step=after_step)


def fr_collectives_per_step() -> list[int]:
    """Flight Recorder's collectives (our own process's ring: trusted) issued inside each step's window; for a
    job that runs more collectives than the ring holds, as counted right after each step (COUNTED_PER_STEP)."""
    if COUNTED_PER_STEP:
        return COUNTED_PER_STEP
    return _created_in_windows(WINDOWS_NS)


def _created_in_windows(windows) -> list[int]:
    entries = (own_dump(stack_traces=False) or {}).get("entries", [])
    created_ns = [e["time_created_ns"] for e in entries if not e["is_p2p"]]
    return [sum(start <= t <= end for t in created_ns) for start, end in windows]


def run_torch_tp(args, model, rank):
    """Torch tensor parallelism (parallelize_module: ColwiseParallel then RowwiseParallel), every rank fed the
    same batches as TP needs. Its collectives are DTensor's functional collectives, issued from C++: only a
    Flight Recorder read while the job runs sees them. The row runs with a ring smaller than the job's
    collectives, so Flight Recorder's own count is taken after each step (outside the step's timing)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    model = parallelize_module(model, mesh, {"layers.0": ColwiseParallel(), "layers.2": RowwiseParallel()})

    def count_after_step():
        COUNTED_PER_STEP.extend(_created_in_windows(WINDOWS_NS[-1:]))

    return train_model(model, batches(args.steps, 0), after_step=count_after_step)


def run_fsdp1(args, model, rank):
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy.FULL_SHARD if args.framework == "fsdp1-full" else ShardingStrategy.SHARD_GRAD_OP
    policy = ModuleWrapPolicy({torch.nn.Linear})  # one FSDP unit per Linear
    # device_id cpu: FSDP1 otherwise insists on an accelerator
    model = FullyShardedDataParallel(
        model, sharding_strategy=strategy, auto_wrap_policy=policy, device_id=torch.device("cpu")
    )
    return train_plain(model, torch.optim.AdamW(model.parameters(), lr=1e-3), args, rank)


def run_fsdp2(args, model, rank):
    """fully_shard per Linear, activation checkpointing on the hidden layers, 2 micro-batches accumulated a step."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        if isinstance(layer, torch.nn.Linear):
            checkpoint(layer)
            fully_shard(layer)
    fully_shard(model)
    return train_plain(model, torch.optim.AdamW(model.parameters(), lr=1e-3), args, rank, accumulate=2)


def train_plain(model, optimizer, args, rank, accumulate: int = 1):
    diag.instrument(model, optimizer)
    data = list(batches(args.steps * accumulate, rank))
    micro_batches = [data[i * accumulate : (i + 1) * accumulate] for i in range(args.steps)]

    def train_step(micro):
        for x, y in micro:
            torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return timed_steps(micro_batches, train_step, samples=lambda micro: sum(len(x) for x, _ in micro))


def timed_steps(batches_, train_step, samples=lambda batch: len(batch[0]), after_step=None) -> list[float]:
    """``train_step(batch)`` inside ``diag.step`` for each batch: the job's own step times (the truth diag's
    straggler cost is checked against) and each step's wall-clock window (for Flight Recorder's collectives)."""
    step_times_s = []
    for batch in batches_:
        start = time.perf_counter()
        WINDOWS_NS.append([time.time_ns(), None])
        with diag.step(samples=samples(batch)):
            train_step(batch)
        WINDOWS_NS[-1][1] = time.time_ns()
        step_times_s.append(time.perf_counter() - start)
        if after_step is not None:
            after_step()
    return step_times_s


def run_hf_trainer(args, model, rank):
    """transformers' Trainer (DDP on gloo, joining this job's process group) with DiagTrainerCallback, as
    docs/integrations.md says: the callback drives diag's steps; this job only times them from outside."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from diag.integrations.huggingface import DiagTrainerCallback

    class Regression(torch.nn.Module):  # a transformers-style model: keyword inputs, a dict with the loss out
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x, y=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, y), "logits": out}

    class Rows(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = [(x[i], y[i]) for x, y in batches(args.steps, rank) for i in range(len(x))]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return {"x": self.rows[i][0], "y": self.rows[i][1]}

    step_times_s = []

    class StepWindows(TrainerCallback):  # after diag's callback: its window holds diag's step
        def on_step_begin(self, *_, **__):
            WINDOWS_NS.append([time.time_ns(), None])
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            WINDOWS_NS[-1][1] = time.time_ns()
            step_times_s.append(time.perf_counter() - self.start)

    training = TrainingArguments(
        output_dir=os.path.join(args.trace_dir, "hf_output"),
        per_device_train_batch_size=8,
        max_steps=args.steps,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        logging_strategy="no",
    )
    callbacks = [DiagTrainerCallback(args.trace_dir, telemetry=False), StepWindows()]
    Trainer(model=Regression(model), args=training, train_dataset=Rows(), callbacks=callbacks).train()
    return step_times_s


def run_lightning(args, model, rank):
    """Lightning's Trainer (DDP strategy, joining this job's process group) with DiagCallback, as
    docs/integrations.md says: the callback drives diag's steps; this job only times them from outside."""
    import warnings

    from lightning.pytorch import Callback, LightningModule, Trainer

    from diag.integrations.lightning import DiagCallback

    warnings.filterwarnings("ignore", module="lightning")  # its advice about num_workers and logging

    class Regression(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    step_times_s = []

    class StepWindows(Callback):  # after diag's callback: its window holds diag's step
        def on_train_batch_start(self, *_):
            WINDOWS_NS.append([time.time_ns(), None])
            self.start = time.perf_counter()

        def on_train_batch_end(self, *_):
            WINDOWS_NS[-1][1] = time.time_ns()
            step_times_s.append(time.perf_counter() - self.start)

    trainer = Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp",
        max_steps=args.steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DiagCallback(args.trace_dir, telemetry=False), StepWindows()],
    )
    data = [batch for batch in batches(args.steps, rank)]  # already batches of 8: the loader passes them on
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=None))
    return step_times_s


RUNNERS = {
    "megatron-tp": run_megatron_tp,
    "deepspeed-accum": run_deepspeed_accumulating,
    "torch-tp": run_torch_tp,
    "lightning": run_lightning,
    "hf-trainer": run_hf_trainer,
    "ddp-4": run_ddp,
    "fsdp1-full": run_fsdp1,
    "fsdp1-grad-op": run_fsdp1,
    "fsdp2": run_fsdp2,
    "ddp": run_ddp,
    "deepspeed-zero1": run_deepspeed,
    "deepspeed-zero2": run_deepspeed,
    "deepspeed-zero3": run_deepspeed,
    "accelerate": run_accelerate,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace_dir")
    parser.add_argument("--framework", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net(args.slow_ms / 1000 if rank == args.slow_rank else 0.0)
    diag.init(args.trace_dir, telemetry=False)
    step_times_s = RUNNERS[args.framework](args, model, rank)
    diag.finish()
    truth = {
        "steps": len(step_times_s),
        "step_times_s": step_times_s,
        "world_size": dist.get_world_size(),
        "fr_collectives_per_step": fr_collectives_per_step(),
        "fr_ring_entries": int(os.environ.get("TORCH_FR_BUFFER_SIZE", "2000")),
        "restored": RESTORED,
    }
    os.makedirs(os.path.join(args.trace_dir, "truth"), exist_ok=True)
    with open(os.path.join(args.trace_dir, "truth", f"rank{rank}.json"), "w") as f:
        json.dump(truth, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
