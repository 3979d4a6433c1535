"""One rank of a real torchtitan 0.3 training job: its ``Trainer`` with the llama3 ``debugmodel`` flavor
(``llama3_debugmodel()``, 6 layers, dim 256, vocab 2048), FSDP2 over the 2 ranks (torchtitan's own
``parallelize_fn``: ``fully_shard`` per transformer block, selective activation checkpointing), AdamW, its
HuggingFace text dataloader and the tokenizer of torchtitan's own tests. diag is adopted as docs/frameworks.md
says: a ``Trainer`` subclass that instruments ``model_parts`` and the optimizers and wraps ``train_step`` in
``diag.step``. An optional planted slow rank sleeps in its forward (a forward pre-hook, the job's only). Writes
what it did (steps, step times it measured itself, Flight Recorder's collectives per step) to
TRACE_DIR/truth/rankN.json.

The CPU settings, and why each is this narrow (none of them replaces torchtitan code):
* device: torchtitan picks its device once, at import, as ``_get_available_device_type() or "cuda"``, so a
  machine without an accelerator gets ``"cuda"`` and ``torch.cuda`` (no option chooses it). Only that choice is
  replaced, before the trainer is built: the modules that imported ``device_type`` / ``device_module`` get
  ``"cpu"`` and ``torch.cpu`` plus the memory-monitor calls ``torch.cpu`` lacks (name, capacity, memory stats:
  none on CPU). torchtitan then initialises the process group itself (``cpu`` maps to gloo in torch's backend
  map) and builds its device mesh, ParallelDims, model, FSDP2, optimizer, dataloader and train loop unchanged.
* config (torchtitan's own options): ``training.disable_cuda_graphs``; float32 ``mixed_precision_param`` (bf16
  mixed precision is a GPU setting); ``parallelism.spmd_backend = "partial_dtensor"`` (plain ``fully_shard``:
  with the default ``spmd_types`` backend, ``fully_shard`` on torch 2.13 stops at "all parameters must be
  DTensors on the full SPMD mesh"); torchtitan's ``ScaledDotProductAttention`` (causal) in each block in place of
  ``FlexAttention``, which has no backward on CPU.
* ``sum_reductions_for_gloo``: FSDP's public ``set_force_sum_reduction_for_comms`` (gloo has no PREMUL_SUM).
* ``torch_set_timeout``: ``torch.distributed.set_timeout``, which torchtitan 0.3 calls and torch 2.13 lacks.

usage: torchtitan_job.py TRACE_DIR --steps N [--slow-rank R --slow-ms MS]
Ranks are started with torchrun's variables (diag.launch.run_ranks).
"""

import argparse
import json
import os
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

import diag
from diag.capture.flight_recorder import own_dump

ASSETS = Path(__file__).resolve().parent / "torchtitan_assets"  # tokenizer.json from torchtitan's tests/assets
SEQ_LEN, LOCAL_BATCH = 32, 1  # the smallest batch: 32 tokens a step and rank
WINDOWS_NS = []  # [start, end] of each step, time.time_ns(), to place Flight Recorder's entries in steps
STEP_TIMES_S = []


def use_cpu_device():
    """torchtitan's device choice, made for a CPU-only machine (see the module's docstring)."""
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.tools.profiler as profiler
    import torchtitan.tools.utils as utils

    cpu = types.SimpleNamespace(
        **{name: getattr(torch.cpu, name) for name in ("set_device", "device_count", "synchronize")},
        current_device=lambda: 0,  # an index, as barrier(device_ids=[...]) wants
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=os.sysconf("SC_PHYS_PAGES")
                                                                        * os.sysconf("SC_PAGE_SIZE")),
        memory_stats=lambda device=None: {},
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None,
    )  # fmt: skip
    for module in (utils, dist_utils, parallel_dims, metrics, profiler):
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu


def torch_set_timeout():
    """torchtitan 0.3 shortens its groups' timeouts after the first step with ``torch.distributed.set_timeout``,
    newer than torch 2.13, which has it as ``distributed_c10d._set_pg_timeout``: provide the former."""
    from torch.distributed import distributed_c10d

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: distributed_c10d._set_pg_timeout(timeout, group)


def sum_reductions_for_gloo(model_parts):
    """torchtitan divides gradients itself (by the global token count) and sets FSDP's divide factor to 1, which
    FSDP2 turns into a ``PREMUL_SUM(1.0)`` reduce-scatter that gloo lacks; a plain SUM is the same reduction."""
    from torch.distributed.fsdp import FSDPModule

    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)


def make_dataset(folder: Path) -> Path:
    """A small local text dataset in the c4_test layout (a data.json of {"text": ...} rows): the wheel does not
    ship torchtitan's tests/assets/c4_test."""
    folder.mkdir(parents=True, exist_ok=True)
    words = ["the", "model", "reads", "a", "token", "and", "predicts", "the", "next", "one", "it", "has", "seen"]
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(400):
        picks = torch.randint(len(words), (60,), generator=generator).tolist()
        rows.append({"text": " ".join(words[i] for i in picks)})
    (folder / "data.json").write_text("\n".join(json.dumps(row) for row in rows))
    return folder


def make_trainer_class():
    from torchtitan.trainer import Trainer

    class DiagTrainer(Trainer):
        """The recipe of docs/frameworks.md, plus the job's own timing of each step (the truth) around it."""

        def __init__(self, config, trace_dir, slow_s=0.0):
            super().__init__(config)  # torchtitan's process group, mesh, model_parts, optimizers
            sum_reductions_for_gloo(self.model_parts)
            diag.init(trace_dir, telemetry=False)
            diag.instrument(*self.model_parts, self.optimizers)
            if slow_s:  # the planted straggler: compute in this rank's forward
                self.model_parts[0].register_forward_pre_hook(lambda *_: time.sleep(slow_s))

        def train_step(self, data_iterator):
            start = time.perf_counter()
            WINDOWS_NS.append([time.time_ns(), None])
            tokens = self.config.training.local_batch_size * self.config.training.seq_len
            with diag.step(tokens=tokens * self.gradient_accumulation_steps):
                super().train_step(data_iterator)
            WINDOWS_NS[-1][1] = time.time_ns()
            STEP_TIMES_S.append(time.perf_counter() - start)

        def close(self):
            super().close()
            diag.finish()

    return DiagTrainer


def build_config(args, dump_folder: Path, dataset: Path):
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    # FlexAttention has no backward on CPU: torchtitan's SDPA module (causal) in each block instead
    for _, _, parent, name in list(config.model_spec.model.traverse(FlexAttention.Config, recurse=True)):
        setattr(parent, name, ScaledDotProductAttention.Config())
    config.hf_assets_path = str(ASSETS)
    config.dump_folder = str(dump_folder)
    config.dataloader.dataset_path = str(dataset)
    config.training.seq_len = SEQ_LEN
    config.training.local_batch_size = LOCAL_BATCH
    config.training.steps = args.steps
    config.training.disable_cuda_graphs = True
    config.training.mixed_precision_param = "float32"
    config.parallelism.data_parallel_shard_degree = -1  # FSDP2 over every rank
    config.parallelism.spmd_backend = "partial_dtensor"  # plain fully_shard (see the docstring)
    config.checkpoint.enable = False
    config.validator.enable = False
    config.metrics.log_freq = 1
    config.comm.trace_buf_size = int(os.environ.get("TORCH_FR_BUFFER_SIZE", "4000"))
    return config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    trace_dir = Path(args.trace_dir)
    work = trace_dir.parent / f"{trace_dir.name}-torchtitan"  # torchtitan's dump folder, outside the trace
    use_cpu_device()
    torch_set_timeout()
    config = build_config(args, work / "outputs", make_dataset(work / f"data{rank}"))
    trainer = make_trainer_class()(config, str(trace_dir), args.slow_ms / 1000 if rank == args.slow_rank else 0.0)
    try:
        trainer.train()
    finally:
        trainer.close()
    entries = (own_dump(stack_traces=False) or {}).get("entries", [])
    created_ns = [e["time_created_ns"] for e in entries if not e["is_p2p"]]
    truth = {
        "steps": len(STEP_TIMES_S),
        "step_times_s": STEP_TIMES_S,
        "world_size": dist.get_world_size(),
        "fr_collectives_per_step": [sum(start <= t <= end for t in created_ns) for start, end in WINDOWS_NS],
    }
    os.makedirs(trace_dir / "truth", exist_ok=True)
    (trace_dir / "truth" / f"rank{rank}.json").write_text(json.dumps(truth))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
