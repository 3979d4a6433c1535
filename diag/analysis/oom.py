"""Why a rank ran out of memory: what held the memory at that moment, what was asked, whether fragmentation or
other processes were to blame, which ranks were closest to the limit and why they differ, and advice ranked by
what each change would free.

Inputs are an ``oom`` event (capture writes the exception's message, the allocator's counters and the memory
categories at that moment) and the memory report of the run. The message is parsed for what PyTorch measured
itself: the allocation that failed, the GPU's total and free memory, what this process holds (NVML, through
PyTorch's ``reportProcessMemoryInfo``) and other processes on the GPU. Both of PyTorch's message formats are
read (torch >= 2.1: "GPU 0 has a total capacity of ..."; before: "(GPU 0; ... total capacity; ...)"), and the CPU
allocator's "you tried to allocate N bytes".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"memory": ("allocated_bytes", "reserved_bytes", "param_bytes", "grad_bytes", "optimizer_state_bytes")}

MAX_OOMS_EXPLAINED = 8
# full recomputation keeps each layer's input, 2·s·b·h of the 34·s·b·h a layer otherwise keeps (Korthikanti et
# al. 2022, Table 2, without the attention scores): the share of activations checkpointing frees
CHECKPOINTING_FREES = 1 - 2 / 34

_SIZE = r"([0-9.]+) (B|bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_PATTERNS = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device_total_bytes": rf"(?:total capacity of {_SIZE}|; {_SIZE} total capacity)",
    "device_free_bytes": rf"(?:of which {_SIZE} is free|; {_SIZE} free)",
    "process_in_use_bytes": rf"this process has {_SIZE} memory in use",
    "pytorch_allocated_bytes": rf"(?:Of the allocated memory {_SIZE} is allocated by PyTorch|; {_SIZE} already allocated)",
    "reserved_unallocated_bytes": rf"{_SIZE} is reserved by PyTorch but unallocated",
    "pytorch_reserved_bytes": rf"; {_SIZE} reserved in total by PyTorch",
}
_OTHER_PROCESS = re.compile(rf"Process (\d+) has {_SIZE} memory in use")
_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")


@dataclass
class OomMessage:
    """What an out-of-memory message says, in bytes (None where it does not say)."""

    requested_bytes: float | None = None
    device_total_bytes: float | None = None
    device_free_bytes: float | None = None
    process_in_use_bytes: float | None = None  # this process, PyTorch's memory and the rest (NVML)
    pytorch_allocated_bytes: float | None = None
    reserved_unallocated_bytes: float | None = None
    other_processes: list[dict] = field(default_factory=list)  # {pid, bytes}

    @property
    def other_processes_bytes(self) -> float | None:
        return sum(p["bytes"] for p in self.other_processes) if self.other_processes else None


def parse_oom_message(text: str) -> OomMessage:
    """The figures of a PyTorch CUDA (either format) or CPU out-of-memory message; what is not there stays None."""
    found = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, text)
        if match:
            number, unit = [g for g in match.groups() if g is not None][:2]
            found[name] = _bytes(number, unit)
    reserved_total = found.pop("pytorch_reserved_bytes", None)
    if reserved_total is not None and found.get("pytorch_allocated_bytes") is not None:  # the older format
        found["reserved_unallocated_bytes"] = max(reserved_total - found["pytorch_allocated_bytes"], 0.0)
    cpu = _CPU_REQUEST.search(text)
    if cpu and "requested_bytes" not in found:
        found["requested_bytes"] = float(cpu.group(1))
    others = [{"pid": int(pid), "bytes": _bytes(n, u)} for pid, n, u in _OTHER_PROCESS.findall(text)]
    return OomMessage(**found, other_processes=others)


def _bytes(number: str, unit: str) -> float | None:
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class Advice:
    action: str
    frees_bytes: float | None  # estimated; None when the run does not say how much
    enough: bool | None  # frees at least the shortfall; None when either is unknown
    why: str


@dataclass
class OomExplanation:
    rank: int
    step: int | None
    requested_bytes: float | None
    device_total_bytes: float | None
    device_free_bytes: float | None
    shortfall_bytes: float | None  # what was asked beyond what was free
    allocated_bytes: float | None  # by PyTorch, at the OOM
    reserved_unallocated_bytes: float | None  # reserved by the allocator but not in use: fragmentation's share
    non_pytorch_bytes: float | None  # this process's memory outside PyTorch's allocator (context, NCCL, ...)
    other_processes_bytes: float | None
    other_processes: list[dict]
    param_bytes: float | None
    grad_bytes: float | None
    optimizer_state_bytes: float | None
    activation_bytes: float | None  # allocated minus the three above: activations and temporaries
    cause: str  # fragmentation, other_processes, out_of_memory, unknown
    verdict: str
    closest_ranks: list[int]
    differs_by: list[str]  # why the OOM rank holds more than the others
    advice: list[Advice]


def explain_ooms(events: pd.DataFrame, report, manifests: dict, world_size: int | None) -> list[OomExplanation]:
    """One explanation per ``oom`` event (the first few), with the memory report's per-rank view."""
    if events.empty or "kind" not in events:
        return []
    ooms = events[events["kind"] == "oom"].head(MAX_OOMS_EXPLAINED)
    return [_explain(_as_dict(row), report, manifests, world_size) for _, row in ooms.iterrows()]


def _as_dict(row: pd.Series) -> dict:
    return {k: (None if _missing(v) else v) for k, v in row.items()}


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or dict
        return False


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _explain(event: dict, report, manifests: dict, world_size: int | None) -> OomExplanation:
    rank = int(event["rank"])
    message = parse_oom_message(str(event.get("message") or ""))
    allocated = _number(event.get("allocated_bytes"))
    allocated = allocated if allocated is not None else message.pytorch_allocated_bytes
    reserved = _number(event.get("reserved_bytes"))
    unallocated = message.reserved_unallocated_bytes
    if unallocated is None and reserved is not None and allocated is not None:
        unallocated = max(reserved - allocated, 0.0)
    params, grads, states = (_number(event.get(k)) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes"))
    activations = None
    if allocated is not None and None not in (params, grads, states):
        activations = max(allocated - params - grads - states, 0.0)
    non_pytorch = None
    if message.process_in_use_bytes is not None and allocated is not None and unallocated is not None:
        non_pytorch = max(message.process_in_use_bytes - allocated - unallocated, 0.0)
    requested, free = message.requested_bytes, message.device_free_bytes
    shortfall = max(requested - free, 0.0) if requested is not None and free is not None else None
    cause, verdict = _verdict(message, unallocated, shortfall)
    closest, differs = _imbalance(rank, report)
    step = event.get("step")
    explanation = OomExplanation(
        rank=rank,
        step=int(step) if _number(step) is not None else None,
        requested_bytes=requested,
        device_total_bytes=message.device_total_bytes,
        device_free_bytes=free,
        shortfall_bytes=shortfall,
        allocated_bytes=allocated,
        reserved_unallocated_bytes=unallocated,
        non_pytorch_bytes=non_pytorch,
        other_processes_bytes=message.other_processes_bytes,
        other_processes=message.other_processes,
        param_bytes=params,
        grad_bytes=grads,
        optimizer_state_bytes=states,
        activation_bytes=activations,
        cause=cause,
        verdict=verdict,
        closest_ranks=closest,
        differs_by=differs,
        advice=[],
    )
    explanation.advice = advise(explanation, _memory_model(manifests, rank), _data_parallel(manifests, world_size))
    return explanation


def _verdict(message: OomMessage, unallocated: float | None, shortfall: float | None) -> tuple[str, str]:
    """Fragmentation when the allocator held, reserved but unused, at least what was asked (in pieces too small);
    other processes when they hold more than the shortfall; else the memory was simply used."""
    requested = message.requested_bytes
    if requested is None:
        return "unknown", "the message does not say what was asked"
    asked = f"asked for {_gib(requested)}"
    if unallocated is not None and unallocated >= requested:
        return "fragmentation", (
            f"{asked} while PyTorch held {_gib(unallocated)} reserved but unallocated: enough in total, in pieces "
            "too small (fragmentation)"
        )
    others = message.other_processes_bytes
    if others and shortfall is not None and others >= shortfall:
        return "other_processes", f"{asked}; other processes on the GPU hold {_gib(others)}, more than was missing"
    free = message.device_free_bytes
    spare = f", {_gib(unallocated)} reserved but unallocated" if unallocated is not None else ""
    if free is None:
        return "out_of_memory", f"{asked}, more than the allocator could give{spare}"
    return "out_of_memory", f"{asked} with {_gib(free)} free{spare}: the memory was in use, not fragmented"


def byte_text(value: float) -> str:
    """Bytes for a finding's text: GiB with two decimals from 1 GiB, else MiB, KiB or bytes."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


_gib = byte_text


def advise(oom: OomExplanation, memory_model, data_parallel: int | None) -> list[Advice]:
    """What would free memory, each with an estimate of how much from the categories at the OOM, most first;
    advice the run cannot size comes last."""
    out = []

    def add(action: str, frees: float | None, why: str) -> None:
        enough = None if frees is None or oom.shortfall_bytes is None else frees >= oom.shortfall_bytes
        out.append(Advice(action, frees, enough, why))

    if oom.reserved_unallocated_bytes:
        add(
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            oom.reserved_unallocated_bytes,
            "reserved-but-unallocated memory becomes usable for any size instead of sitting in fixed segments",
        )
    if oom.other_processes_bytes:
        pids = ", ".join(str(p["pid"]) for p in oom.other_processes[:5])
        add(f"stop the other processes on this GPU (pid {pids})", oom.other_processes_bytes, "they hold its memory")
    activations = oom.activation_bytes
    add(
        "activation checkpointing (torch.utils.checkpoint, or FSDP/Megatron/DeepSpeed activation checkpointing)",
        activations * CHECKPOINTING_FREES if activations is not None else None,
        "keeps each layer's input instead of its activations (2 of ~34 bytes per token and hidden unit)",
    )
    add(
        "halve the micro-batch (and double gradient accumulation to keep the global batch)",
        activations / 2 if activations is not None else None,
        "activations scale with the micro-batch",
    )
    for action, frees, why in _sharding_advice(oom, memory_model, data_parallel):
        add(action, frees, why)
    if oom.optimizer_state_bytes:
        add(
            "offload the optimizer to CPU (DeepSpeed offload_optimizer, FSDP CPUOffload)",
            oom.optimizer_state_bytes,
            "optimizer state and master weights move to host memory; the step runs on the CPU",
        )
    out.sort(key=lambda a: (a.frees_bytes is None, -(a.frees_bytes or 0.0)))
    return out


_SHARDED_AT = {0: (), 1: ("optimizer_state_bytes",), 2: ("optimizer_state_bytes", "grad_bytes")}
_SHARDED_AT[3] = (*_SHARDED_AT[2], "param_bytes")
_STAGE_ACTIONS = {
    1: "ZeRO-1 (shard the optimizer state)",
    2: "ZeRO-2 / FSDP SHARD_GRAD_OP (shard optimizer state and gradients)",
    3: "ZeRO-3 / FSDP FULL_SHARD (shard the parameters too)",
}


def _sharding_advice(oom: OomExplanation, memory_model, n: int | None) -> list[tuple[str, float | None, str]]:
    """The ZeRO stages / FSDP strategies above the run's: each shards more categories over the n data-parallel
    ranks, which keeps 1/n of each of them (what the run's stage already shards is 1/n already)."""
    if memory_model is not None and memory_model.sharding == "none" and not n:
        return []  # the ranks do not replicate one model (no data parallelism): nothing to shard over
    stage = memory_model.zero_stage if memory_model is not None and memory_model.zero_stage is not None else 0
    if memory_model is not None and memory_model.shard_degree:
        n = memory_model.shard_degree
    if not n or n < 2:
        return []
    out = []
    for target in range(stage + 1, 4):
        newly = [getattr(oom, name) for name in _SHARDED_AT[target] if name not in _SHARDED_AT[stage]]
        held = None if any(v is None for v in newly) else sum(newly)
        frees = held * (1 - 1 / n) if held is not None else None
        out.append((_STAGE_ACTIONS[target], frees, f"over the {n} data-parallel ranks"))
    return out


def _memory_model(manifests: dict, rank: int):
    manifest = manifests.get(rank) or next(iter(manifests.values()), None)
    return getattr(manifest, "memory_model", None)


def _data_parallel(manifests: dict, world_size: int | None) -> int | None:
    """Ranks the model states could be sharded over: the layout's dp, else the world without its tensor,
    pipeline and context splits when the model is data parallel (DDP, FSDP, DeepSpeed)."""
    layout = next((m.parallel for m in manifests.values() if m.parallel is not None), None)
    if layout is not None and layout.dp:
        return layout.dp
    model = next((m.memory_model for m in manifests.values() if m.memory_model is not None), None)
    if world_size is None or (model is not None and model.sharding == "none"):
        return None
    split = 1
    if layout is not None:
        split = (layout.tp or 1) * (layout.pp or 1) * (layout.cp or 1)
    return world_size // split if split and world_size % split == 0 else None


CATEGORY_NAMES = (
    ("param_bytes", "parameters"),
    ("grad_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("activation_peak_bytes", "activations"),
    ("non_pytorch_bytes", "memory outside PyTorch"),
)


def _imbalance(rank: int, report) -> tuple[list[int], list[str]]:
    """The ranks closest to the limit (least headroom; without device totals, most memory held) and the
    categories in which the OOM rank holds more than the median rank, largest first."""
    ranks = report.per_rank if report is not None else []
    closest = list(report.closest_to_oom) if report is not None and report.closest_to_oom else []
    if not closest:
        held = [r for r in ranks if _held(r) is not None]  # a rank without readings is not compared
        closest = [r.rank for r in sorted(held, key=_held, reverse=True)][:5]
    this = next((r for r in ranks if r.rank == rank), None)
    if this is None or len(ranks) < 2:
        return closest, []
    differs = []
    for name, label in CATEGORY_NAMES:
        values = [getattr(r, name) for r in ranks if r.rank != rank and getattr(r, name) is not None]
        own = getattr(this, name)
        if own is None or not values:
            continue
        excess = own - float(pd.Series(values).median())
        if excess > 0.01 * max(own, 1):
            differs.append((excess, f"{label}: {_gib(own)}, {_gib(excess)} more than the median other rank"))
    return closest, [text for _, text in sorted(differs, reverse=True)]


def _held(rank_memory) -> float | None:
    """What a rank held at its peak: reserved where CUDA says, else its categories."""
    if rank_memory.peak_reserved_bytes is not None:
        return float(rank_memory.peak_reserved_bytes)
    parts = [rank_memory.param_bytes, rank_memory.grad_bytes, rank_memory.optimizer_state_bytes]
    return float(sum(parts)) if all(p is not None for p in parts) else None
