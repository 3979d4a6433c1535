"""`diag memory-plan`'s formulas against the published worked examples (the ZeRO paper's 16 bytes per parameter
and its Table 1 / Figure 1 for a 7.5B model, Korthikanti et al.'s Table 2 for GPT-3 175B) and against a measured
run (the real H100 DDP run in the shared fixtures), its layout search, and the command."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from diag.analysis.memory_plan import (
    PlanError,
    PlanInput,
    activation_bytes_per_layer,
    cheapest_layouts,
    optimizer_key,
    plan_memory,
    transformer_params,
)
from diag.cli import main
from diag.commands.memory_plan import parse_count

GB = 1e9


def model_states_gb(plan) -> float:
    return (plan.param_bytes + plan.grad_bytes + plan.optimizer_state_bytes) / GB


def test_mixed_precision_adam_is_16_bytes_per_parameter_and_a_7b_model_112_gb():
    plan = plan_memory(PlanInput(params=7e9, dtype="bf16", optimizer="adam"))
    assert plan.state_bytes_per_param == (2, 2, 12)  # ZeRO §3.1: 2Ψ + 2Ψ + KΨ, K = 12
    assert plan.bytes_per_param == 16
    assert model_states_gb(plan) == pytest.approx(112.0)
    # pure fp32 Adam is also 16 bytes a parameter, split 4 + 4 + 8 (no master copy)
    assert plan_memory(PlanInput(params=7e9, dtype="fp32", optimizer="adamw")).state_bytes_per_param == (4, 4, 8)


# ZeRO paper, Table 1: per-device model-state memory (GB) of a 7.5B model, K = 12, by DP degree and stage
ZERO_TABLE_1_7_5B = {
    4: (52.5, 41.3, 30.0),
    16: (35.6, 21.6, 7.5),
    64: (31.4, 16.6, 1.88),
    256: (30.4, 15.4, 0.47),
    1024: (30.1, 15.1, 0.12),
}


@pytest.mark.parametrize("dp", sorted(ZERO_TABLE_1_7_5B))
def test_zero_stages_match_the_zero_papers_table_for_a_7_5b_model(dp):
    assert model_states_gb(plan_memory(PlanInput(params=7.5e9, dp=dp))) == pytest.approx(120.0)
    for stage, published in zip((1, 2, 3), ZERO_TABLE_1_7_5B[dp], strict=True):
        predicted = model_states_gb(plan_memory(PlanInput(params=7.5e9, dp=dp, zero=stage)))
        assert predicted == pytest.approx(published, abs=0.051 if published > 1 else 0.006), (dp, stage)


def test_fsdp_strategies_and_hybrid_sharding_partition_as_their_zero_stage():
    full = plan_memory(PlanInput(params=7.5e9, dp=64, zero=3))
    hybrid = plan_memory(PlanInput(params=7.5e9, dp=64, zero=3, shard_size=8))  # HSDP: 8 GPUs per copy
    assert model_states_gb(full) == pytest.approx(1.875)
    assert model_states_gb(hybrid) == pytest.approx(120 / 8)


def test_tensor_and_pipeline_parallelism_split_the_parameters_before_zero():
    plan = plan_memory(PlanInput(params=175e9, dp=8, tp=8, pp=8, zero=1))
    local = 175e9 / 64
    assert plan.param_bytes == pytest.approx(2 * local)
    assert plan.optimizer_state_bytes == pytest.approx(12 * local / 8)


# GPT-3 175B as Korthikanti et al. size it: h 12288, a 96, s 2048, micro-batch 1, t 8
GPT3 = {"params": 175e9, "seq_len": 2048, "micro_batch": 1, "hidden": 12288, "heads": 96, "layers": 96, "tp": 8}


def test_activation_memory_per_layer_follows_korthikanti_table_2():
    sbh = 2048 * 1 * 12288
    assert 5 * 96 * 2048 / 12288 == 80  # the paper: 5as/h = 80 for GPT-3, dominating the 34
    per_layer = {
        ("none", False, 1): sbh * (34 + 80),  # no parallelism
        ("none", False, 8): sbh * (10 + 24 / 8 + 80 / 8),  # tensor parallel
        ("none", True, 8): sbh * (34 + 80) / 8,  # tensor + sequence parallel
        ("selective", False, 8): sbh * (10 + 24 / 8),  # tensor parallel + selective recomputation
        ("selective", True, 8): sbh * 34 / 8,  # all three
        ("full", False, 8): sbh * 2,  # full recomputation keeps each layer's input
    }
    for (recompute, sp, t), expected in per_layer.items():
        inp = PlanInput(**{**GPT3, "tp": t}, recompute=recompute, sequence_parallel=sp)
        assert activation_bytes_per_layer(inp) == pytest.approx(expected), (recompute, sp, t)
    # the paper's headline: sequence parallelism with selective recomputation cuts activations ~5x against
    # tensor parallelism alone
    baseline = activation_bytes_per_layer(PlanInput(**GPT3))
    best = activation_bytes_per_layer(PlanInput(**GPT3, recompute="selective", sequence_parallel=True))
    assert baseline / best == pytest.approx(23 / 4.25) and baseline / best > 5


def test_with_a_pipeline_the_first_stage_holds_all_layers_activations():
    one = plan_memory(PlanInput(**{**GPT3, "tp": 8}, sequence_parallel=True, recompute="selective"))
    piped = plan_memory(
        PlanInput(**{**GPT3, "tp": 8}, pp=8, grad_accum=64, sequence_parallel=True, recompute="selective")
    )
    assert piped.activation_bytes == pytest.approx(one.activation_bytes)  # 1F1B: p micro-batches of L/p layers
    interleaved = plan_memory(
        PlanInput(
            **{**GPT3, "tp": 8}, pp=8, grad_accum=64, virtual_stages=2, sequence_parallel=True, recompute="selective"
        )
    )
    assert interleaved.activation_bytes == pytest.approx(one.activation_bytes * (1 + 7 / (8 * 64)))


def test_the_real_h100_run_is_predicted_within_its_measured_memory(gpu_fixtures):
    """The shared fixtures' real run: GPT-like, fp32 parameters under bf16 autocast, fused AdamW, DDP. At a step's
    end it holds parameters and Adam's state (12 bytes/parameter) and DDP's gradient buckets (4 more, DDP keeps a
    copy of the gradients unless gradient_as_bucket_view); at its peak also gradients and activations."""
    run = json.loads((gpu_fixtures / "cuda_run_h100.json").read_text())
    config = run["model"]
    steps = run["memory_steps"][5:]  # after warm-up
    plan = plan_memory(
        PlanInput(
            params=config["params"],
            dtype="fp32",
            optimizer="adamw",
            micro_batch=config["B"],
            seq_len=config["T"],
            hidden=config["D"],
            layers=config["L"],
            heads=config["H"],
            vocab=config["V"],
            flash_attention=True,  # scaled_dot_product_attention on an H100 in bf16
            dropout=False,
        )
    )
    ddp_buckets = 4 * config["params"]
    at_step_end = plan.param_bytes + plan.optimizer_state_bytes + ddp_buckets
    measured_end = min(s["allocated_bytes.all.current"] for s in steps)
    assert at_step_end == pytest.approx(measured_end, rel=0.05)
    predicted_peak = (
        plan.param_bytes + plan.grad_bytes + plan.optimizer_state_bytes + plan.activation_bytes + ddp_buckets
    )
    measured_peaks = [s["allocated_bytes.all.peak"] for s in steps]
    assert predicted_peak == pytest.approx(min(measured_peaks), rel=0.15)  # autocast's bf16 copies are not modelled
    assert predicted_peak < min(measured_peaks)


def test_transformer_parameter_count_is_narayanans_formula():
    # GPT-3 175B: 96 layers, h 12288, vocab 51200, s 2048
    assert transformer_params(96, 12288, 51200, 2048) == pytest.approx(174.6e9, rel=0.01)


def test_layouts_that_fit_are_listed_cheapest_first_and_all_fit():
    inp = PlanInput(
        params=7e9, dp=8, zero=0, micro_batch=4, seq_len=4096, hidden=4096, layers=32, heads=32, gpu_bytes=80 * 2**30
    )
    assert plan_memory(inp).fits is False
    layouts = cheapest_layouts(inp, limit=10)
    assert layouts
    assert all(p.fits and p.total_bytes <= inp.gpu_bytes for p in layouts)
    assert all(p.input.gpus == 8 for p in layouts)
    assert [p.slowdown for p in layouts] == sorted(p.slowdown for p in layouts)
    # ZeRO-2 is free (the same communication as DDP): the cheapest layout that fits uses it rather than ZeRO-3
    assert layouts[0].input.zero in (1, 2)


def test_a_layout_that_fits_is_its_own_cheapest_layout():
    inp = PlanInput(params=1e9, dp=8, zero=1, gpu_bytes=80 * 2**30)
    assert plan_memory(inp).fits
    best = cheapest_layouts(inp)[0]
    assert best.slowdown == 0 and (best.input.tp, best.input.pp) == (1, 1)


def test_nothing_fits_when_even_the_smallest_layout_is_too_big():
    # less memory than what a process holds outside PyTorch (CUDA context, libraries): nothing can fit
    assert cheapest_layouts(PlanInput(params=1e9, dp=2, gpu_bytes=2**30)) == []


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"dtype": "int3"}, "unknown dtype"),
        ({"optimizer": "lbfgs-ish"}, "unknown optimizer"),
        ({"offload": "params", "zero": 2}, "needs ZeRO-3"),
        ({"zero": 4}, "zero must be"),
        ({"dp": 4, "shard_size": 3}, "must divide"),
        ({"params": float("nan")}, "positive number"),
    ],
)
def test_input_the_formulas_cannot_take_is_a_clear_error(bad, says):
    with pytest.raises(PlanError, match=says):
        plan_memory(PlanInput(**{"params": 1e9, **bad}))


def test_optimizer_class_names_map_to_formula_keys():
    assert optimizer_key("AdamW") == "adamw"
    assert optimizer_key("FusedAdam") == "adam"
    assert optimizer_key("DeepSpeedCPUAdam") == "adam"
    assert optimizer_key("SGD") == "sgd"
    assert optimizer_key("Adam8bit") == "adam8bit"


def test_counts_parse_as_people_write_them():
    assert parse_count("7e9") == 7e9 and parse_count("7B") == 7e9 and parse_count("350M") == 350e6
    assert parse_count("1.3b") == pytest.approx(1.3e9) and parse_count("70_000") == 70000
    with pytest.raises(ValueError):
        parse_count("seven")


def test_command_prints_the_plan_and_layouts_as_json():
    argv = ["memory-plan", "--params", "7e9", "--dtype", "bf16", "--optimizer", "adam", "--dp", "8", "--zero", "2"]
    argv += ["--gpu-gib", "80", "--format", "json"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    plan = out["plan"]
    assert plan["param_bytes"] == pytest.approx(14e9) and plan["grad_bytes"] == pytest.approx(14e9 / 8)
    assert plan["optimizer_state_bytes"] == pytest.approx(84e9 / 8) and plan["fits"] is True
    assert plan["input"]["layout"] == "dp=8, ZeRO-2"
    assert all(layout["fits"] for layout in out["layouts_that_fit"])


def test_command_says_it_does_not_fit_and_what_would():
    argv = ["memory-plan", "--params", "7B", "--gpus", "8", "--gpu-gib", "80", "--micro-batch", "4"]
    argv += ["--seq-len", "4096", "--hidden", "4096", "--layers", "32", "--heads", "32", "--flash-attention"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert "Fits a 80.0 GiB GPU: NO" in result.output
    assert "Cheapest layouts of these 8 GPUs that fit" in result.output
    assert "Korthikanti" in result.output and "ZeRO" in result.output


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--dp", "8"], "give --params"),
        (["--params", "7e9", "--dtype", "int3"], "unknown dtype"),
        (["--params", "lots"], "not a count"),
        (["--params", "7e9", "--gpus", "6", "--tp", "4"], "do not divide"),
    ],
)
def test_command_errors_say_what_to_fix(argv, says):
    result = CliRunner().invoke(main, ["memory-plan", *argv])
    assert result.exit_code != 0 and says in result.output


def test_plan_json_is_finite():
    plan = plan_memory(PlanInput(params=7e9, micro_batch=1, seq_len=2048, hidden=4096, layers=32, heads=32))
    assert all(math.isfinite(v) for v in (plan.total_bytes, plan.activation_bytes))
    json.dumps(plan.to_dict(), allow_nan=False)
