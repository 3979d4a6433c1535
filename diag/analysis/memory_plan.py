"""Will it fit: per-GPU memory of a training layout from the standard formulas (docs/memory.md cites each).

* Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
  §3.1 and §5): mixed-precision Adam holds 2 bytes of 16-bit parameters, 2 of 16-bit gradients and K = 12 of
  optimizer state (fp32 master weights, momentum, variance) per parameter: 16 bytes, 112 GB for a 7B model.
  ZeRO stage 1 partitions the optimizer state over the N_d data-parallel ranks, stage 2 the gradients too,
  stage 3 the parameters too: 2Ψ + 2Ψ + KΨ/N_d, 2Ψ + (2 + K)Ψ/N_d, (2 + 2 + K)Ψ/N_d. FSDP's FULL_SHARD is
  stage 3, SHARD_GRAD_OP stage 2, NO_SHARD none. Tensor and pipeline parallelism split the parameters
  (Shoeybi et al. 2019, Narayanan et al. 2021): Ψ/(t·p) per GPU before ZeRO.
* Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  Table 2): per transformer layer, in bytes of 16-bit activations with dropout, s·b·h·(34 + 5·a·s/h) without
  parallelism; s·b·h·(10 + 24/t + 5·a·s/(h·t)) with tensor parallelism; s·b·h/t·(34 + 5·a·s/h) with sequence
  parallelism too; the 5·a·s/h term (attention scores, softmax, its dropout) goes with selective
  recomputation; full recomputation keeps only each layer's input, 2·s·b·h (/t with sequence parallelism).
  With 1F1B pipelining the first stage holds p micro-batches of L/p layers: L layers' worth (§4.2.3), times
  (1 + (p−1)/(p·m)) when interleaved. The output layer's fp32 logits for the loss add 4·s·b·v/t (§4.3).

Everything here is arithmetic on the numbers given: no torch, no trace. ``plan_memory`` predicts one layout;
``cheapest_layouts`` searches layouts of the same GPUs that fit, ranked by a stated, rough cost model.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"memory": ("param_bytes", "grad_bytes", "optimizer_state_bytes"), "telemetry": ("mem_total_bytes",)}

if TYPE_CHECKING:
    from diag.trace.loader import Trace

GIB = 2**30

DTYPE_BYTES = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# Optimizer state per parameter in bytes, without a master copy of the weights (added when there is one):
# Adam's two fp32 moments; SGD's fp32 momentum buffer (none without momentum); 8-bit Adam's two 1-byte states
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4, "sgd-nomomentum": 0, "adam8bit": 2, "none": 0}
MASTER_WEIGHT_BYTES = 4  # the fp32 copy that mixed precision updates (part of ZeRO's K = 12)

# What a process holds on the GPU besides the caching allocator's tensors: the CUDA context, library
# workspaces, NCCL buffers. At the real H100 OOM (shared fixtures, torch 2.11, CUDA 13) the process had
# 78.86 GiB in use of which PyTorch reserved 77.57 GiB: 1.29 GiB outside PyTorch.
DEFAULT_OVERHEAD_BYTES = int(1.3 * GIB)
# The caching allocator reserves more than it hands out: 6% to 15% above the step's peak allocation in the
# real H100 run (shared fixtures' cuda_run_h100.json: reserved 6.27 GB, step peaks 5.44 to 5.91 GB).
DEFAULT_FRAGMENTATION_PCT = 10.0

RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "params")
FSDP_STRATEGIES = {"full_shard": 3, "shard_grad_op": 2, "no_shard": 0, "hybrid_shard": 3, "_hybrid_shard_zero2": 2}

# The rough cost model that orders layouts that fit (a fraction of step time added; docs/memory.md):
ZERO3_SLOWDOWN = 0.10  # 1.5x data-parallel communication volume (ZeRO §7.2.3), partly exposed
RECOMPUTE_SLOWDOWN = {"none": 0.0, "selective": 0.03, "full": 0.33}  # full: one more forward of ~1/3 the FLOPs
TP_SLOWDOWN_PER_DOUBLING = 0.05  # two all-reduces per layer in forward and in backward, on the critical path
MICRO_BATCH_HALVING_SLOWDOWN = 0.05  # smaller GEMMs, with gradient accumulation keeping the global batch
OFFLOAD_SLOWDOWN = {"none": 0.0, "optimizer": 0.30, "params": 0.60}  # CPU optimizer step, PCIe transfers
MAX_TENSOR_PARALLEL = 8  # within one node's NVLink domain


class PlanError(ValueError):
    """An input the formulas cannot take (an unknown dtype, a layout that does not divide); says which."""


@dataclass(frozen=True)
class PlanInput:
    params: float  # Ψ: parameters of the whole model
    dtype: str = "bf16"  # of the parameters and gradients on the GPU
    optimizer: str = "adam"
    master_weights: bool | None = None  # an fp32 copy of the weights; None: yes when ``dtype`` is below 32 bits
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0  # ZeRO stage (FSDP: full_shard 3, shard_grad_op 2, no_shard 0)
    shard_size: int | None = None  # ranks one copy is sharded over (hybrid sharding); None: dp x cp
    offload: str = "none"  # none, optimizer (state and master weights to CPU), params (ZeRO-3: all model states)
    # transformer shape, for activations (all of micro_batch, seq_len, hidden, layers, heads needed)
    micro_batch: int | None = None
    seq_len: int | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    vocab: int | None = None
    recompute: str = "none"  # none, selective, full
    sequence_parallel: bool = False
    flash_attention: bool = False  # attention scores never stored: no 5·a·s/h term
    dropout: bool = True
    activation_dtype: str = "bf16"
    grad_accum: int = 1  # micro-batches per optimizer step (m, for the pipeline)
    virtual_stages: int = 1  # interleaved pipeline: model chunks per stage
    gpu_bytes: float | None = None
    overhead_bytes: float = DEFAULT_OVERHEAD_BYTES
    fragmentation_pct: float = DEFAULT_FRAGMENTATION_PCT

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def has_shape(self) -> bool:
        return None not in (self.micro_batch, self.seq_len, self.hidden, self.layers, self.heads)

    def layout_text(self) -> str:
        parts = [f"dp={self.dp}"] + [
            f"{k}={v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp)) if v > 1
        ]
        parts.append(f"ZeRO-{self.zero}" if self.zero else "no ZeRO")
        if self.sequence_parallel and self.tp > 1:
            parts.append("sequence parallel")
        if self.recompute != "none":
            parts.append(f"{self.recompute} recompute")
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        if self.micro_batch is not None:
            parts.append(f"micro-batch {self.micro_batch}")
        return ", ".join(parts)


@dataclass
class MemoryPlan:
    """Bytes per GPU by category (the most loaded GPU: the first pipeline stage), and whether it fits."""

    input: PlanInput
    param_bytes: float
    grad_bytes: float
    optimizer_state_bytes: float
    activation_bytes: float | None  # None without the transformer shape
    overhead_bytes: float  # CUDA context, libraries, NCCL: outside PyTorch's allocator
    fragmentation_bytes: float  # what the caching allocator reserves above what it hands out
    total_bytes: float
    cpu_bytes: float  # offloaded model states, in host memory
    fits: bool | None  # None without a GPU size
    headroom_bytes: float | None
    bytes_per_param: float  # model states per parameter before partitioning (16 for mixed-precision Adam)
    state_bytes_per_param: tuple[float, float, float]  # parameter, gradient, optimizer state: (2, 2, 12) above
    master_weights: bool  # the optimizer keeps an fp32 copy of the weights
    formulas: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    slowdown: float = 0.0  # the rough cost model's added share of step time against no ZeRO-3/recompute/...

    def to_dict(self) -> dict:
        out = asdict(self)
        out["input"] = {**asdict(self.input), "gpus": self.input.gpus, "layout": self.input.layout_text()}
        return out


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        raise PlanError(f"unknown dtype {dtype!r}; one of {', '.join(sorted(DTYPE_BYTES))}") from None


def optimizer_key(name: str) -> str:
    """A torch or DeepSpeed optimizer class name (AdamW, FusedAdam, DeepSpeedCPUAdam, SGD) as a formula key."""
    key = name.lower().replace("_", "").replace(" ", "")
    if key in OPTIMIZER_STATE_BYTES:
        return key
    if "8bit" in key and "adam" in key:
        return "adam8bit"
    if "adam" in key or "lamb" in key:  # LAMB keeps Adam's two moments
        return "adamw" if "adamw" in key else "adam"
    if "sgd" in key:
        return "sgd"
    raise PlanError(f"unknown optimizer {name!r}; one of {', '.join(OPTIMIZER_STATE_BYTES)}")


def transformer_params(layers: int, hidden: int, vocab: int = 0, seq_len: int = 0) -> float:
    """Parameters of a GPT-style transformer, 12·L·h²·(1 + 13/(12h) + (v + s)/(12·L·h)) (Narayanan et al. 2021,
    "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §5.1)."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq_len) / (12 * layers * hidden))


def model_state_bytes_per_param(inp: PlanInput) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer-state) bytes per parameter before any partitioning: 2, 2, 12 for
    mixed-precision Adam (ZeRO's 2Ψ + 2Ψ + KΨ with K = 12)."""
    width = dtype_bytes(inp.dtype)
    state = OPTIMIZER_STATE_BYTES[optimizer_key(inp.optimizer)] + (
        MASTER_WEIGHT_BYTES if has_master_weights(inp) else 0
    )
    return float(width), float(width), float(state)


def has_master_weights(inp: PlanInput) -> bool:
    return inp.master_weights if inp.master_weights is not None else dtype_bytes(inp.dtype) < 4


def activation_bytes_per_layer(inp: PlanInput) -> float:
    """Korthikanti et al. 2022, Table 2, for one micro-batch: bytes of 16-bit activations one transformer layer
    keeps for its backward (scaled by the activation width for others). Context parallelism splits the sequence."""
    s = inp.seq_len / inp.cp
    b, h, a, t = inp.micro_batch, inp.hidden, inp.heads, inp.tp
    scale = dtype_bytes(inp.activation_dtype) / 2
    if inp.recompute == "full":
        return 2 * s * b * h / (t if inp.sequence_parallel else 1) * scale
    linear = 34.0 - (0.0 if inp.dropout else 2.0)  # without dropout: no masks after attention and MLP
    scores = 0.0 if inp.flash_attention or inp.recompute == "selective" else 5 * a * s / h
    if not inp.dropout and scores:
        scores = 2 * a * s / h  # the softmax dropout mask (1 byte) and its output (2) go; the softmax (2) stays
    if t > 1 and not inp.sequence_parallel:  # layer norms and dropouts are replicated across the t ranks
        replicated = 10.0 - (0.0 if inp.dropout else 2.0)
        return s * b * h * (replicated + (linear - replicated) / t + scores / t) * scale
    return s * b * h * (linear + scores) / t * scale


def activation_bytes(inp: PlanInput) -> float | None:
    """All activations of the first pipeline stage (the most loaded): L layers' worth with 1F1B, interleaving's
    extra, plus the output layer's fp32 logits when the vocabulary is given and there is no pipeline."""
    if not inp.has_shape:
        return None
    per_layer = activation_bytes_per_layer(inp)
    total = per_layer * inp.layers
    if inp.pp > 1 and inp.virtual_stages > 1:
        total *= 1 + (inp.pp - 1) / (inp.pp * max(inp.grad_accum, 1))
    if inp.recompute == "full":  # the layer being recomputed holds its activations in full meanwhile
        total += activation_bytes_per_layer(replace(inp, recompute="none"))
    if inp.vocab and inp.pp == 1:  # with a pipeline the logits are on the last stage, not the first
        total += 4 * inp.seq_len / inp.cp * inp.micro_batch * inp.vocab / inp.tp
    return total


def validate(inp: PlanInput) -> None:
    problems = []
    if not (inp.params > 0 and math.isfinite(inp.params)):
        problems.append(f"params must be a positive number, not {inp.params!r}")
    for name in ("dp", "tp", "pp", "cp", "grad_accum", "virtual_stages"):
        if getattr(inp, name) < 1:
            problems.append(f"{name} must be at least 1")
    if inp.zero not in (0, 1, 2, 3):
        problems.append(f"zero must be 0, 1, 2 or 3, not {inp.zero!r}")
    if inp.recompute not in RECOMPUTE:
        problems.append(f"recompute must be one of {RECOMPUTE}")
    if inp.offload not in OFFLOAD:
        problems.append(f"offload must be one of {OFFLOAD}")
    if inp.offload == "params" and inp.zero != 3:
        problems.append("offloading parameters needs ZeRO-3 / FSDP full sharding")
    elif inp.offload == "optimizer" and inp.zero < 1:
        problems.append("offloading the optimizer needs ZeRO stage 1, 2 or 3 (DeepSpeed's offload_optimizer)")
    if inp.shard_size is not None and (inp.shard_size < 1 or (inp.dp * inp.cp) % inp.shard_size):
        problems.append(f"shard_size {inp.shard_size} must divide dp x cp = {inp.dp * inp.cp}")
    for name in ("micro_batch", "seq_len", "hidden", "layers", "heads", "vocab"):
        value = getattr(inp, name)
        if value is not None and value < 1:
            problems.append(f"{name} must be a positive integer")
    if problems:
        raise PlanError("; ".join(problems))
    dtype_bytes(inp.dtype), dtype_bytes(inp.activation_dtype), optimizer_key(inp.optimizer)


def plan_memory(inp: PlanInput) -> MemoryPlan:
    validate(inp)
    per_param, per_grad, per_state = model_state_bytes_per_param(inp)
    local = inp.params / (inp.tp * inp.pp)  # this GPU's share of the model before ZeRO
    shards = inp.shard_size or inp.dp * inp.cp
    params = local * per_param / (shards if inp.zero >= 3 else 1)
    grads = local * per_grad / (shards if inp.zero >= 2 else 1)
    states = local * per_state / (shards if inp.zero >= 1 else 1)
    cpu = 0.0
    notes = []
    if inp.offload in ("optimizer", "params"):
        cpu += states
        states = 0.0
        notes.append("optimizer state and master weights offloaded to CPU; reduce buckets stay on the GPU")
    if inp.offload == "params":
        cpu += params + grads
        # what stays is the working set: the layer being computed and the next one prefetched (12·h² each)
        params = grads = 0.0
        if inp.hidden:
            params = 2 * 12 * inp.hidden**2 / inp.tp * per_param
            notes.append("parameters offloaded: two layers' parameters gathered on the GPU at a time")
        else:
            notes.append("parameters offloaded: the layers gathered to the GPU at a time are not counted (no --hidden)")
    activations = activation_bytes(inp)
    if activations is None:
        notes.append("activations not predicted: give micro-batch, sequence length, hidden size, layers and heads")
    allocated = params + grads + states + (activations or 0.0)
    fragmentation = allocated * inp.fragmentation_pct / 100
    total = allocated + fragmentation + inp.overhead_bytes
    fits = None if inp.gpu_bytes is None else total <= inp.gpu_bytes
    return MemoryPlan(
        input=inp,
        param_bytes=params,
        grad_bytes=grads,
        optimizer_state_bytes=states,
        activation_bytes=activations,
        overhead_bytes=float(inp.overhead_bytes),
        fragmentation_bytes=fragmentation,
        total_bytes=total,
        cpu_bytes=cpu,
        fits=fits,
        headroom_bytes=None if inp.gpu_bytes is None else inp.gpu_bytes - total,
        bytes_per_param=per_param + per_grad + per_state,
        state_bytes_per_param=(per_param, per_grad, per_state),
        master_weights=has_master_weights(inp),
        formulas=_formulas(inp, per_param, per_grad, per_state, shards),
        notes=notes,
        slowdown=slowdown(inp),
    )


def _formulas(inp: PlanInput, per_param: float, per_grad: float, per_state: float, shards: int) -> list[str]:
    split = f"/(t·p = {inp.tp * inp.pp})" if inp.tp * inp.pp > 1 else ""
    out = [
        f"model states: {per_param:g} + {per_grad:g} + {per_state:g} = {per_param + per_grad + per_state:g} "
        f"bytes/parameter (ZeRO §3.1: 2 + 2 + K), Ψ{split}, ZeRO-{inp.zero} over N_d = {shards} "
        f"(stage 1: K/N_d, 2: (2+K)/N_d, 3: all /N_d)"
    ]
    if inp.has_shape:
        out.append(
            f"activations per layer: {_activation_formula(inp)} x {inp.layers} layers (Korthikanti et al. 2022, Table 2)"
        )
    return out


def _activation_formula(inp: PlanInput) -> str:
    """The Table 2 row that applies, in its own notation."""
    sequence_parallel = inp.sequence_parallel and inp.tp > 1
    if inp.recompute == "full":
        return "2·s·b·h" + ("/t" if sequence_parallel else "") + " (full recomputation: each layer's input)"
    linear = "34" if inp.dropout else "32"
    scores = (
        "" if inp.flash_attention or inp.recompute == "selective" else (" + 5·a·s/h" if inp.dropout else " + 2·a·s/h")
    )
    why = (
        " (selective recomputation)"
        if inp.recompute == "selective"
        else " (flash attention)"
        if inp.flash_attention and inp.recompute == "none"
        else ""
    )
    if inp.tp > 1 and not sequence_parallel:
        replicated = "10" if inp.dropout else "8"
        return f"s·b·h·({replicated} + 24/t{scores.replace('/h', '/(h·t)')}){why}"
    return f"s·b·h{'/t' if inp.tp > 1 else ''}·({linear}{scores}){why}" + ("" if inp.dropout else " (no dropout)")


def slowdown(inp: PlanInput, reference_micro_batch: int | None = None) -> float:
    """The rough cost model (docs/memory.md): the share of step time a layout adds against plain data
    parallelism with everything kept and the reference micro-batch; it orders layouts, nothing more."""
    cost = ZERO3_SLOWDOWN if inp.zero >= 3 else 0.0
    cost += RECOMPUTE_SLOWDOWN[inp.recompute] + OFFLOAD_SLOWDOWN[inp.offload]
    cost += TP_SLOWDOWN_PER_DOUBLING * math.log2(inp.tp)
    if inp.pp > 1:  # 1F1B bubble (Narayanan et al. 2021): (p - 1) / m, interleaving divides it by v
        cost += (inp.pp - 1) / (max(inp.grad_accum, 1) * inp.virtual_stages)
    if reference_micro_batch and inp.micro_batch:
        cost += MICRO_BATCH_HALVING_SLOWDOWN * max(0.0, math.log2(reference_micro_batch / inp.micro_batch))
    return cost


def cheapest_layouts(inp: PlanInput, limit: int = 5) -> list[MemoryPlan]:
    """Layouts of the same GPUs that fit ``inp.gpu_bytes``, cheapest first by the rough cost model: every
    tensor-parallel degree up to 8 (dividing the heads), pipeline degree (dividing the layers), ZeRO stage,
    recomputation, offload and micro-batch down to 1 (more accumulation keeps the global batch)."""
    if inp.gpu_bytes is None:
        return []
    gpus = inp.gpus
    candidates = []
    for tp, pp, zero, recompute, offload, micro in itertools.product(
        _tensor_degrees(inp, gpus),
        _divisors(gpus),
        (0, 1, 2, 3),
        RECOMPUTE if inp.has_shape else ("none",),
        OFFLOAD,
        _micro_batches(inp),
    ):
        if gpus % (tp * pp * inp.cp) or (inp.layers and inp.layers % pp):
            continue
        dp = gpus // (tp * pp * inp.cp)
        if zero and dp * inp.cp == 1 and offload == "none":
            continue  # nothing to partition over: the same as no ZeRO
        if (offload == "params" and zero != 3) or (offload == "optimizer" and zero < 1):
            continue
        accum = inp.grad_accum * (inp.micro_batch // micro if inp.micro_batch and micro else 1)
        candidate = replace(
            inp,
            tp=tp,
            pp=pp,
            dp=dp,
            zero=zero,
            shard_size=None,
            recompute=recompute,
            offload=offload,
            micro_batch=micro,
            grad_accum=accum,
            sequence_parallel=tp > 1,  # same communication volume as tensor parallelism alone (Korthikanti §4.2.2)
        )
        plan = plan_memory(candidate)
        if plan.fits:
            plan.slowdown = slowdown(candidate, inp.micro_batch)
            candidates.append(plan)
    candidates.sort(key=lambda p: (round(p.slowdown, 6), p.total_bytes))
    # one line per split of the model and batch: its cheapest ZeRO stage and recomputation that fit (a dearer
    # one of the same split that also fits is never the better choice)
    unique, seen = [], set()
    for plan in candidates:
        key = (plan.input.tp, plan.input.pp, plan.input.micro_batch, plan.input.offload)
        if key not in seen:
            seen.add(key)
            unique.append(plan)
    return unique[:limit]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tensor_degrees(inp: PlanInput, gpus: int) -> list[int]:
    return [
        t
        for t in (1, 2, 4, 8)
        if t <= min(gpus, MAX_TENSOR_PARALLEL) and gpus % t == 0 and (not inp.heads or inp.heads % t == 0)
    ]


def _micro_batches(inp: PlanInput) -> list[int | None]:
    if inp.micro_batch is None:
        return [None]
    out, b = [], inp.micro_batch
    while b >= 1:
        out.append(b)
        if b % 2:
            break
        b //= 2
    return out if out[-1] == 1 else [*out, 1]


def plan_input_from_trace(trace: Trace) -> tuple[dict, float | None, list[str]]:
    """``PlanInput`` fields from what a run's manifests recorded (``memory_model``, ``model_shape``, ``parallel``,
    the world size), the GPU's memory from its telemetry, and notes on what is missing."""
    notes: list[str] = []
    inputs: dict = {}
    model = trace.first_manifest_value("memory_model")
    layout = trace.first_manifest_value("parallel")
    for name in ("tp", "pp", "cp", "dp"):
        value = getattr(layout, name, None) if layout is not None else None
        if value:
            inputs[name] = value
    if trace.world_size:
        inputs["world_size"] = trace.world_size
    if model is None:
        notes.append("the manifests have no memory_model (diag.instrument(model, optimizer) records it)")
    else:
        if model.params:
            inputs["params"] = float(model.params)
        elif model.params_local:  # local shards (megatron-core tensor parallel): the whole model is t·p of them
            inputs["params"] = float(model.params_local * inputs.get("tp", 1) * inputs.get("pp", 1))
            notes.append("the whole model's parameters taken as this rank's times tp x pp")
        if model.param_dtype and model.param_dtype.lower() in DTYPE_BYTES:
            inputs["dtype"] = model.param_dtype
        if model.optimizer:
            try:
                inputs["optimizer"] = optimizer_key(model.optimizer)
            except PlanError:
                notes.append(f"optimizer {model.optimizer} is not one the formulas know: taken as Adam")
        if model.master_weights:
            inputs["master_weights"] = True
        if model.zero_stage is not None:
            inputs["zero"] = model.zero_stage
        if model.shard_degree and model.zero_stage:
            inputs["shard_size"] = model.shard_degree
    shape = trace.first_manifest_value("model_shape")
    if shape is not None:
        inputs.update({k: v for k, v in asdict(shape).items() if v is not None})
    return inputs, _device_total_bytes(trace), notes


def _device_total_bytes(trace: Trace) -> float | None:
    tel = trace.telemetry
    if tel.empty or tel["mem_total_bytes"].isna().all():
        return None
    return float(tel["mem_total_bytes"].max())


def complete_layout(inputs: dict, gpus: int | None = None) -> dict:
    """``inputs`` with dp from ``gpus`` (or the trace's ``world_size``) when not given; raises PlanError when
    the GPUs do not divide into the other degrees or disagree with them."""
    inputs = dict(inputs)
    world = gpus or inputs.get("world_size")
    inputs.pop("world_size", None)
    others = inputs.get("tp", 1) * inputs.get("pp", 1) * inputs.get("cp", 1)
    if "dp" not in inputs and world:
        if world % others:
            raise PlanError(f"{world} GPUs do not divide into tp x pp x cp = {others}")
        inputs["dp"] = world // others
    elif gpus and inputs["dp"] * others != gpus:
        raise PlanError(f"{gpus} GPUs is not dp x tp x pp x cp = {inputs['dp'] * others}")
    return inputs


@dataclass
class CategoryComparison:
    category: str  # param_bytes, grad_bytes, optimizer_state_bytes, activation_bytes
    predicted_bytes: float | None
    measured_bytes: float | None  # the median rank's (activations: its largest step)

    @property
    def ratio(self) -> float | None:
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return self.predicted_bytes / self.measured_bytes


@dataclass
class PlanComparison:
    """``diag memory-plan``'s prediction for the run's own layout against what the run measured."""

    layout: str
    rows: list[CategoryComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_against_measured(trace: Trace, per_rank: list) -> PlanComparison | None:
    """The plan from what the manifests recorded, set against the measured categories (median over ranks);
    None when the manifests lack the model's size or the run recorded no categories."""
    inputs, gpu_bytes, notes = plan_input_from_trace(trace)
    measured = [r for r in per_rank if r.param_bytes is not None]
    if "params" not in inputs or not measured:
        return None
    try:
        inp = PlanInput(**complete_layout(inputs), gpu_bytes=gpu_bytes)
        plan = plan_memory(inp)
    except (PlanError, TypeError) as exc:
        return PlanComparison(layout="", notes=[*notes, f"no prediction: {exc}"])

    def median(name: str) -> float | None:
        values = sorted(getattr(r, name) for r in measured if getattr(r, name) is not None)
        return float(values[len(values) // 2]) if values else None

    rows = [
        CategoryComparison("param_bytes", plan.param_bytes, median("param_bytes")),
        CategoryComparison("grad_bytes", plan.grad_bytes, median("grad_bytes")),
        CategoryComparison("optimizer_state_bytes", plan.optimizer_state_bytes, median("optimizer_state_bytes")),
        CategoryComparison("activation_bytes", plan.activation_bytes, median("activation_peak_bytes")),
    ]
    return PlanComparison(layout=f"{inp.gpus} GPUs, {inp.layout_text()}", rows=rows, notes=notes + plan.notes)
