"""``diag memory-plan``: will a training layout fit a GPU, and which layouts of the same GPUs would. Never
imports torch: the formulas are arithmetic (diag/analysis/memory_plan.py, docs/memory.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from diag.commands._options import Finite
from diag.commands.exit_codes import InputError

_SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """7e9, 7B, 1.3b, 350M, 70_000_000 -> a number; anything else raises ValueError."""
    match = re.fullmatch(r"\s*([0-9][0-9_]*\.?[0-9_]*(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not match:
        raise ValueError(f"{text!r} is not a count such as 7e9, 7B or 350M")
    return float(match.group(1).replace("_", "")) * _SUFFIXES[match.group(2)]


def _gpu_bytes(gpu_gib: float | None, trace_gpu_bytes: float | None) -> float | None:
    return gpu_gib * 2**30 if gpu_gib is not None else trace_gpu_bytes


@click.command("memory-plan")
@click.option("--params", "params_text", metavar="N", help="Parameters of the whole model: 7e9, 7B, 350M.")
@click.option("--dtype", default=None, help="Parameter and gradient dtype on the GPU: bf16, fp16, fp32.  [bf16]")
@click.option("--optimizer", default=None, help="adam, adamw, sgd, sgd-nomomentum, adam8bit, none.  [adam]")
@click.option(
    "--master-weights/--no-master-weights",
    default=None,
    help="An fp32 copy of the weights in the optimizer (default: yes when dtype is 16-bit).",
)
@click.option("--dp", type=click.IntRange(min=1), help="Data-parallel degree.  [GPUs / (tp x pp x cp)]")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel degree.  [1]")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel degree.  [1]")
@click.option("--cp", type=click.IntRange(min=1), help="Context-parallel degree.  [1]")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs in all (gives dp when --dp is not given).")
@click.option("--zero", type=click.IntRange(0, 3), help="DeepSpeed ZeRO stage.  [0]")
@click.option(
    "--fsdp",
    type=click.Choice(["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"]),
    help="FSDP sharding strategy (full_shard is ZeRO-3, shard_grad_op ZeRO-2).",
)
@click.option("--shard-size", type=click.IntRange(min=1), help="Ranks one copy is sharded over (hybrid sharding).")
@click.option("--offload", type=click.Choice(["none", "optimizer", "params"]), help="Offload to CPU.  [none]")
@click.option("--micro-batch", type=click.IntRange(min=1), help="Micro-batch size (sequences).")
@click.option("--seq-len", type=click.IntRange(min=1), help="Sequence length (tokens).")
@click.option("--hidden", type=click.IntRange(min=1), help="Hidden size h.")
@click.option("--layers", type=click.IntRange(min=1), help="Transformer layers L.")
@click.option("--heads", type=click.IntRange(min=1), help="Attention heads a.")
@click.option("--vocab", type=click.IntRange(min=1), help="Vocabulary size (the output layer's logits).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), help="Activation recomputation.")
@click.option("--sequence-parallel", is_flag=True, default=None, help="Megatron sequence parallelism (with tp).")
@click.option("--flash-attention", is_flag=True, default=None, help="Attention scores are never stored.")
@click.option("--no-dropout", is_flag=True, default=None, help="The model has no dropout (no masks kept).")
@click.option("--grad-accum", type=click.IntRange(min=1), help="Micro-batches per optimizer step.  [1]")
@click.option("--gpu-gib", type=Finite(min=0, min_open=True), help="GPU memory in GiB (80 GB H100: 79.2).")
@click.option("--overhead-gib", type=Finite(min=0), help="Memory outside PyTorch per GPU.  [1.3]")
@click.option("--fragmentation-pct", type=Finite(min=0), help="Allocator reserve above peak.  [10]")
@click.option(
    "--trace",
    "trace_dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Take what the run's manifests recorded (parameters, dtype, optimizer, sharding, layout, GPU size); "
    "options given here override it.",
)
@click.option(
    "--layouts",
    "layout_count",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many of the cheapest layouts that fit to list.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def command(params_text, trace_dir, layout_count, fmt, gpu_gib, fsdp, gpus, **options):
    """Predict per-GPU memory (parameters, gradients, optimizer state, activations) of a training layout
    with the ZeRO paper's and Korthikanti et al.'s formulas (diag docs memory), say whether it fits the GPU,
    and list the cheapest layouts of the same GPUs that would.

    \b
    Examples:
      diag memory-plan --params 7e9 --dtype bf16 --optimizer adam --dp 8 --zero 2 --gpu-gib 80
      diag memory-plan --params 7B --gpus 8 --gpu-gib 80 --micro-batch 4 --seq-len 4096 \\
          --hidden 4096 --layers 32 --heads 32 --flash-attention
      diag memory-plan --trace traces/run1 --format json
    """
    from diag.analysis.memory_plan import PlanError, cheapest_layouts, plan_memory
    from diag.views.memory_plan import render_plan_text

    given = {k: v for k, v in options.items() if v is not None}
    trace_gpu_bytes = None
    base: dict = {}
    if trace_dir is not None:
        base, trace_gpu_bytes, notes = _from_trace(trace_dir)
        for note in notes:
            click.echo(f"note: {note}", err=True)
    if params_text is not None:
        try:
            base["params"] = parse_count(params_text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--params") from exc
    if fsdp is not None:
        from diag.analysis.memory_plan import FSDP_STRATEGIES

        given.setdefault("zero", FSDP_STRATEGIES[fsdp])
    if given.pop("no_dropout", None):
        given["dropout"] = False
    inputs = {**base, **given}
    gpu_total = _gpu_bytes(gpu_gib, trace_gpu_bytes)
    if gpu_total is not None:
        inputs["gpu_bytes"] = gpu_total
    for key, scale in (("overhead_gib", 2**30),):
        if key in inputs:
            inputs["overhead_bytes"] = inputs.pop(key) * scale
    try:
        from diag.analysis.memory_plan import PlanInput, complete_layout

        inputs = complete_layout(inputs, gpus)
        if "params" not in inputs:
            inputs["params"] = _params_from_shape(inputs)
        inp = PlanInput(**inputs)
        plan = plan_memory(inp)
        layouts = cheapest_layouts(inp, layout_count) if layout_count else []
    except PlanError as exc:
        raise click.UsageError(str(exc)) from exc
    if fmt == "json":
        click.echo(json.dumps({"plan": plan.to_dict(), "layouts_that_fit": [p.to_dict() for p in layouts]}, indent=1))
    else:
        click.echo(render_plan_text(plan, layouts))


def _params_from_shape(inputs: dict) -> float:
    from diag.analysis.memory_plan import transformer_params

    if inputs.get("layers") and inputs.get("hidden"):
        return transformer_params(
            inputs["layers"], inputs["hidden"], inputs.get("vocab") or 0, inputs.get("seq_len") or 0
        )
    raise click.UsageError("give --params (or --layers and --hidden, or a --trace whose manifest has the model size)")


def _from_trace(trace_dir: Path) -> tuple[dict, float | None, list[str]]:
    """Plan inputs from a trace's manifests (and its GPU's size from telemetry); notes on what is missing."""
    from diag.analysis.memory_plan import plan_input_from_trace
    from diag.trace.loader import TraceError, load

    try:
        trace = load(trace_dir)
    except TraceError as exc:
        raise InputError(str(exc)) from exc
    return plan_input_from_trace(trace)
