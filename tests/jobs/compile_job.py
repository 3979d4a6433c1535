"""A tiny transformer trained for a few steps under one ``torch.compile`` style, with or without diag. Prints,
as JSON, dynamo's own counters (graph breaks, unique graphs, recompilations) and, with diag, the steps it
recorded.

usage: compile_job.py CASE WITH_DIAG(0|1) TRACE_DIR STEPS [WRAP]   (as one rank of a gloo job: ``CASE`` is then
       run on the model wrapped in DDP, or with WRAP=fsdp2 in FSDP2's fully_shard; RANK, WORLD_SIZE,
       MASTER_ADDR and MASTER_PORT from the launcher)

The backend is ``aot_eager``: dynamo's graph breaks, graphs and recompilations do not depend on the backend,
and inductor's C++ build of every kernel takes minutes on a loaded CPU host. On a GPU (``DEVICE = "cuda"``)
``reduce_overhead`` compiles with inductor's CUDA graphs (``mode="reduce-overhead"``).
"""

import contextlib
import json
import logging
import os
import sys

import torch
import torch._dynamo
from torch._dynamo.utils import counters

import diag

BACKEND = "aot_eager"
VOCAB, WIDTH, HEADS, SEQ, BATCH = 32, 16, 2, 8, 4
CASES = (
    "compile_then_instrument",  # torch.compile(model), then diag.instrument(compiled, optimizer)
    "instrument_then_compile",  # diag.instrument(model, optimizer), then torch.compile(model)
    "module_compile",  # diag.instrument(model, optimizer), then model.compile() in place
    "per_block",  # torchtitan: every block compiled in place, the model itself eager
    "compiled_optimizer_step",  # torch.compile(optimizer.step)
    "compiled_autograd",  # torch.compile(model) and compiled autograd for the backward
    "compiled_train_step",  # forward, backward and optimizer step in one compiled function
)
CUDA_CASES = (*CASES, "reduce_overhead")  # torch.compile(model, mode="reduce-overhead"): inductor, CUDA graphs
DEVICE = "cpu"  # where the model and its batches live ("cuda": the GPU tests set it)
WRAPS = ("ddp", "fsdp2")  # how a gloo job wraps the model: DDP, or FSDP2's fully_shard per block and root


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(WIDTH)
        self.attention = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, WIDTH)
        )

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def _wrap(model, wrap: str | None):
    """DDP, or FSDP2 as torchtitan applies it: each block sharded, then the root."""
    if wrap == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        return fully_shard(model)
    return model


def _compile(case: str, model, with_diag: bool, wrap: str | None):
    """The model to call, its optimizer and the optimizer step to call, set up in the case's order: wrapped
    (DDP, fully_shard) before torch.compile, but per block compiled first, as torchtitan does before fully_shard."""
    if case == "per_block":
        for block in model.layers:
            block.compile(backend=BACKEND)
    model = _wrap(model, wrap)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after fully_shard, which replaces the parameters
    step = optimizer.step
    instrument = diag.instrument if with_diag else (lambda *objects: None)
    if case == "compile_then_instrument":
        model = torch.compile(model, backend=BACKEND)
        instrument(model, optimizer)
    elif case in ("instrument_then_compile", "compiled_autograd"):
        instrument(model, optimizer)
        model = torch.compile(model, backend=BACKEND)
    elif case == "module_compile":
        instrument(model, optimizer)
        model.compile(backend=BACKEND)
    elif case in ("per_block", "compiled_train_step"):
        instrument(model, optimizer)
    elif case == "compiled_optimizer_step":
        instrument(model, optimizer)
        step = torch.compile(optimizer.step, backend=BACKEND)
    elif case == "reduce_overhead":
        instrument(model, optimizer)
        model = torch.compile(model, mode="reduce-overhead")
    else:
        raise ValueError(f"unknown case {case!r}")
    return model, optimizer, step


def _backward_context(case: str):
    if case != "compiled_autograd":
        return contextlib.nullcontext()
    return torch._dynamo.compiled_autograd._enable(torch.compile(backend=BACKEND))


class _LoggedRecords(logging.Handler):
    """Dynamo's graph-break and recompilation log records (``TORCH_LOGS=graph_breaks,recompiles``): a break in
    the first instruction of a frame, where dynamo then skips the frame, is logged but not always counted in
    ``counters["graph_break"]``."""

    def __init__(self):
        super().__init__()
        self.graph_breaks = self.recompiles = 0

    def emit(self, record):
        if record.name.endswith("__graph_breaks"):
            self.graph_breaks += 1
        elif record.name.endswith("__recompiles"):
            self.recompiles += 1


@contextlib.contextmanager
def _logged_records():
    records = _LoggedRecords()
    torch._logging.set_logs(graph_breaks=True, recompiles=True)
    logger = logging.getLogger("torch._dynamo")  # torch._logging gives it its own handlers, not propagated
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        torch._logging.set_logs()


def run_case(case: str, with_diag: bool, trace_dir: str, steps: int, wrap: str | None = None) -> dict:
    """Train ``steps`` steps from a fresh dynamo state; dynamo's counters and log records after them. ``wrap``:
    None, or one of WRAPS in a gloo job."""
    with _logged_records() as records:
        result = _train(case, with_diag, trace_dir, steps, wrap)
    result["logged_graph_breaks"] = records.graph_breaks
    result["logged_recompiles"] = records.recompiles
    return result


def _train(case: str, with_diag: bool, trace_dir: str, steps: int, wrap: str | None) -> dict:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TinyTransformer().to(DEVICE)
    if with_diag:
        diag.init(trace_dir, telemetry=False)
    model, optimizer, optimizer_step = _compile(case, model, with_diag, wrap)

    def train_step(tokens):
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        with _backward_context(case):
            loss.backward()
        optimizer_step()
        optimizer.zero_grad()

    if case == "compiled_train_step":
        train_step = torch.compile(train_step, backend=BACKEND)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator).to(DEVICE)
        with diag.step() if with_diag else contextlib.nullcontext():
            train_step(tokens)
    if with_diag:
        diag.finish()
    result = {
        "case": case,
        "with_diag": with_diag,
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": sorted({reason.splitlines()[0] for reason in counters["graph_break"]}),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "recompiles": sum(counters["recompiles"].values()),
    }
    torch._dynamo.reset()
    return result


def main() -> None:
    case, with_diag, trace_dir, steps = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
    wrap = sys.argv[5] if len(sys.argv) > 5 else "ddp"
    if wrap not in WRAPS:
        raise SystemExit(f"WRAP is one of {', '.join(WRAPS)}, not {wrap!r}")
    import torch.distributed as dist

    dist.init_process_group("gloo")
    result = run_case(case, with_diag, trace_dir, steps, wrap)
    result["rank"] = dist.get_rank()
    dist.destroy_process_group()
    print(json.dumps(result), flush=True)


if __name__ == "__main__" and os.environ.get("RANK") is not None:
    main()
