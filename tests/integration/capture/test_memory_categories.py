"""Memory by category (parameters, gradients, optimizer state) from real 2-rank gloo runs, against the true
tensor sizes worked out here from the model's shapes and each framework's sharding rule, independently of how
capture walks the tensors: DDP (full copies), FSDP2 (fully_shard: dim-0 shards padded to equal size, optimizer
state on the unpadded shard) and DeepSpeed ZeRO-2 (flat buffer; gradients and fp32 master weights partitioned)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

import diag
from diag.analysis.report import analyze
from diag.cli import main
from diag.launch import run_ranks
from tests.conftest import JOBS

WORLD, STEPS = 2, 6
HIDDEN = 64
# the job's model: Linear(64, 64), ReLU, Linear(64, 64), Linear(64, 1); weights then biases, in order
SHAPES = [(HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,), (1, HIDDEN), (1,)]
FLOAT32 = 4
ADAM_STEP_BYTES = 4  # torch's Adam keeps its step count as a float32 scalar tensor per parameter


def numel(shape) -> int:
    return math.prod(shape)


def run_job(trace_dir, mode: str, steps: int = STEPS, env: dict | None = None) -> diag.Trace:
    results = run_ranks([str(JOBS / "memory_job.py"), str(trace_dir), mode, str(steps)], WORLD, env=env, timeout_s=400)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return diag.load(trace_dir)


def categories(trace, rank: int) -> dict:
    rows = trace.memory[trace.memory["rank"] == rank].sort_values("step")
    last = rows.iloc[-1]
    return {c: int(last[c]) for c in ("param_bytes", "grad_bytes", "optimizer_state_bytes")}


def test_ddp_categories_are_the_full_model_on_every_rank(tmp_path):
    trace = run_job(tmp_path, "ddp")
    params = sum(numel(s) for s in SHAPES)
    expected = {
        "param_bytes": FLOAT32 * params,
        "grad_bytes": FLOAT32 * params,  # gloo DDP copies the reduced bucket back into each .grad
        "optimizer_state_bytes": 2 * FLOAT32 * params + ADAM_STEP_BYTES * len(SHAPES),  # AdamW's two moments
    }
    for rank in range(WORLD):
        assert categories(trace, rank) == expected
        rows = trace.memory[trace.memory["rank"] == rank].sort_values("step")
        assert rows["categories_step"].tolist() == [0, 1, 2, 2, 2, 2]  # measured at the first three steps
    model = trace.manifests[0].memory_model
    assert (model.params, model.param_dtype, model.optimizer, model.sharding) == (params, "float32", "AdamW", "ddp")
    # diag memory-plan --trace takes the run's model and layout and predicts what it measured
    result = CliRunner().invoke(main, ["memory-plan", "--trace", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plan"]
    assert plan["input"]["layout"] == "dp=2, no ZeRO" and plan["state_bytes_per_param"] == [4, 4, 8]
    assert (plan["param_bytes"], plan["grad_bytes"]) == (expected["param_bytes"], expected["grad_bytes"])
    assert plan["optimizer_state_bytes"] == expected["optimizer_state_bytes"] - ADAM_STEP_BYTES * len(SHAPES)


def fsdp2_shard_rows(shape, rank: int) -> tuple[int, int]:
    """(padded rows, real rows) of dim 0 that fully_shard gives ``rank``: torch.chunk's split, every shard padded
    to the first's size."""
    padded = math.ceil(shape[0] / WORLD)
    real = max(0, min(padded, shape[0] - rank * padded))
    return padded, real


def test_fsdp2_categories_are_each_ranks_shards(tmp_path):
    trace = run_job(tmp_path, "fsdp2")
    for rank in range(WORLD):
        padded = sum(fsdp2_shard_rows(s, rank)[0] * numel(s[1:]) for s in SHAPES)
        real = sum(fsdp2_shard_rows(s, rank)[1] * numel(s[1:]) for s in SHAPES)
        expected = {
            "param_bytes": FLOAT32 * padded,  # each shard's storage is padded
            "grad_bytes": FLOAT32 * padded,  # reduce-scatter's padded output, one storage per fully_shard group
            "optimizer_state_bytes": 2 * FLOAT32 * real + ADAM_STEP_BYTES * len(SHAPES),  # moments of the real rows
        }
        assert categories(trace, rank) == expected, rank
    # the last Linear has one row: rank 1's shard of it is empty, so its optimizer state is smaller
    assert categories(trace, 1)["optimizer_state_bytes"] < categories(trace, 0)["optimizer_state_bytes"]
    model = trace.manifests[0].memory_model
    assert (model.params, model.sharding, model.zero_stage, model.shard_degree) == (8385, "fsdp2", 3, WORLD)
    report = analyze(trace)
    spread = {c.category: c for c in report.memory.spread}
    assert spread["optimizer_state_bytes"].max_rank == 0 and spread["optimizer_state_bytes"].min_rank == 1


def zero2_gradient_elements(rank: int, partition: int, flat: int) -> int:
    """Gradient elements a ZeRO-2 rank holds after backward (DeepSpeed 0.19's path without offload): the whole
    gradient of every parameter its partition [rank·P, (rank+1)·P) of the flat buffer touches, and the flat
    buffer's padding that falls in it."""
    start, end, offset, held = rank * partition, (rank + 1) * partition, 0, 0
    for shape in SHAPES:
        size = numel(shape)
        if offset < end and offset + size > start:
            held += size
        offset += size
    return held + max(0, min(end, flat) - max(start, offset))


@pytest.mark.slow
def test_deepspeed_zero2_partitions_gradients_and_optimizer_state(tmp_path):
    pytest.importorskip("deepspeed")
    trace = run_job(tmp_path, "deepspeed-zero2", env={"DS_ACCELERATOR": "cpu"})
    params = sum(numel(s) for s in SHAPES)
    flat = math.ceil(params / (2 * WORLD)) * 2 * WORLD  # DeepSpeed pads its flat buffer to divide evenly
    partition = flat // WORLD
    for rank in range(WORLD):
        found = categories(trace, rank)
        assert found["param_bytes"] == FLOAT32 * flat  # ZeRO-2 keeps every parameter, in one flat buffer
        assert found["grad_bytes"] == FLOAT32 * zero2_gradient_elements(rank, partition, flat), rank
        # fp32 master weights and Adam's two moments of the partition: ZeRO's K = 12 bytes per parameter / N_d
        assert found["optimizer_state_bytes"] == 3 * FLOAT32 * partition + ADAM_STEP_BYTES
    assert zero2_gradient_elements(1, partition, flat) < params  # rank 1 holds well under a full gradient
    model = trace.manifests[0].memory_model
    assert (model.sharding, model.zero_stage, model.shard_degree, model.master_weights) == ("deepspeed", 2, 2, True)
    # the plan from the manifest predicts ZeRO-2's partitioning of the optimizer state (fp32 master + Adam)
    rows = {r.category: r for r in analyze(trace).memory.plan.rows}
    assert rows["optimizer_state_bytes"].predicted_bytes == pytest.approx(12 * params / WORLD)
    assert rows["optimizer_state_bytes"].ratio == pytest.approx(1.0, rel=0.01)
    assert rows["param_bytes"].ratio == pytest.approx(1.0, rel=0.01)


def test_categories_are_remeasured_every_50_steps(tmp_path):
    trace = run_job(tmp_path, "ddp", steps=52)
    measured_at = trace.memory[trace.memory["rank"] == 0].sort_values("step")["categories_step"].tolist()
    assert measured_at == [0, 1, 2] + [2] * 47 + [50, 50]


def test_cpu_oom_report_names_what_the_rank_held_and_how_it_differs(tmp_path):
    """A real allocator failure (rank 1 asks the CPU allocator for 2**50 bytes in its forward) on a job whose
    rank 1 also holds an output head of vocabulary 4096, as a last pipeline stage does."""
    trace = run_job(tmp_path, "oom")
    events = trace.events[trace.events["kind"] == "oom"]
    assert events["rank"].tolist() == [1] and events["step"].tolist() == [3]
    report = analyze(trace)
    (oom,) = report.memory.ooms
    body = HIDDEN * HIDDEN + HIDDEN
    head = HIDDEN * 4096 + 4096
    assert oom.requested_bytes == 2**50
    assert oom.param_bytes == FLOAT32 * (body + head)
    assert oom.optimizer_state_bytes == 2 * FLOAT32 * (body + head) + ADAM_STEP_BYTES * 4
    assert oom.grad_bytes == 0  # zero_grad set them to None before this step's forward
    assert oom.closest_ranks[0] == 1
    assert oom.differs_by[0].startswith("optimizer state") and oom.differs_by[1].startswith("parameters")
    assert oom.advice[0].action.startswith("offload the optimizer") and oom.advice[0].frees_bytes > 0
    assert not any("ZeRO" in a.action for a in oom.advice)  # the ranks hold different models: nothing to shard
    finding = next(f for f in report.findings if f.kind == "oom")
    assert finding.ranks == [1] and "offload the optimizer" in finding.advice
    # the dashboard's figure: per step for the rank holding most (rank 1), and every rank side by side
    from diag.analysis.memory import category_series
    from diag.dashboard.figures import memory_categories_figure

    figure = memory_categories_figure(category_series(trace.memory), report.memory.per_rank, None)
    per_step = [t for t in figure.data if t.type == "scatter"]
    assert figure.layout.annotations[0].text == "rank 1 per step"
    assert [t.name for t in per_step] == ["parameters", "gradients", "optimizer state"]
    bars = {t.name: list(t.y) for t in figure.data if t.type == "bar"}
    assert list(figure.data[1].x) == [0, 1] and bars["parameters"][1] > bars["parameters"][0]
    # the dashboard's memory page explains the OOM and ranks its advice as the report does
    from diag.dashboard.data import Snapshot
    from diag.dashboard.pages import update_memory

    snap = Snapshot(version=1, trace_dir=tmp_path, trace=trace, report=report, run_state="finished")
    summary = [li.children for li in update_memory(snap, None)["summary"].children]
    assert "rank 1 step 3: asked for 1048576.00 GiB, more than the allocator could give" in summary
    assert any(line.startswith("Advice, most freed first: offload the optimizer") for line in summary)
    assert any(line.startswith("Memory plan (2 GPUs, dp=2, no ZeRO), predicted / measured") for line in summary)


WORLD, STEPS = 2, 6


def test_a_model_shape_given_to_init_gives_the_report_its_activation_prediction(tmp_path):
    import torch

    shape = {"micro_batch": 2, "seq_len": 16, "hidden": 32, "layers": 2, "heads": 4}
    with pytest.raises(ValueError, match="model_shape"):
        diag.init(tmp_path / "bad", model_shape={**shape, "hidden": 0})
    with pytest.raises(ValueError, match="unknown keys"):
        diag.init(tmp_path / "bad", model_shape={"hiden": 32})
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diag.init(tmp_path, telemetry=False, watchdog=False, model_shape=shape)
    diag.instrument(model, optimizer)
    for _ in range(3):
        with diag.step():
            model(torch.randn(2, 16, 32)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    trace = diag.load(tmp_path)
    assert trace.manifests[0].model_shape.hidden == 32
    rows = {r.category: r for r in analyze(trace).memory.plan.rows}
    sbh = 16 * 2 * 32
    assert rows["activation_bytes"].predicted_bytes == pytest.approx(2 * sbh * (34 + 5 * 4 * 16 / 32))
    assert rows["activation_bytes"].measured_bytes is None  # no CUDA allocator on this run
    params = sum(p.numel() for p in model.parameters())
    assert rows["param_bytes"].predicted_bytes == rows["param_bytes"].measured_bytes == 4 * params
