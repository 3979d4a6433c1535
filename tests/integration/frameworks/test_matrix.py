"""The framework matrix: for each framework, a real 2-rank (DDP also 4-rank) gloo job (tests/frameworks/job.py) run twice, as a
baseline and with rank 1 planted 40 ms slower in its forward, adopted as docs/frameworks.md says. Each row
checks the steps, the collectives per step against the rank's own Flight Recorder, non-zero forward, backward
and optimizer time that cover the step, and the straggler's rank, cause and cost (within 25% of the slowdown
measured between the two runs, or of the plant: see cost_truths_s).

One row per framework runs by default; the others are marked ``slow`` (each DeepSpeed job takes ~1.5 min on a
loaded 2-core machine, most of it importing and initialising DeepSpeed; the others ~10 s).
"""

import json
import statistics

import pytest

import diag
from diag.launch import run_ranks
from tests.analysis.helpers import cost_truths_s
from tests.frameworks import HERE
from tests.integrations.helpers import analyze_json, rank_steps

WORLD, STEPS, SLOW_RANK, SLOW_MS = 2, 10, 1, 40.0
WARMUP = 2  # first steps: lazy initialisation (DeepSpeed's and the allocator's), left out of the medians

ROWS = [
    pytest.param("ddp"),
    pytest.param("ddp-4", marks=pytest.mark.slow),
    pytest.param("fsdp1-full"),
    pytest.param("fsdp1-grad-op", marks=pytest.mark.slow),
    pytest.param("fsdp2"),  # activation checkpointing, 2 micro-batches accumulated a step
    pytest.param("deepspeed-zero1"),
    pytest.param("deepspeed-zero2", marks=pytest.mark.slow),
    pytest.param("deepspeed-zero3", marks=pytest.mark.slow),
    # ZeRO-1, 2 micro-batches an update, diag's steps at the accumulation boundary (no diag.step() in the loop)
    pytest.param("deepspeed-accum", marks=pytest.mark.slow),
    pytest.param("accelerate"),
    pytest.param("hf-trainer"),  # transformers' Trainer with DiagTrainerCallback
    pytest.param("lightning"),  # Lightning's Trainer with DiagCallback
    pytest.param("torch-tp"),  # parallelize_module, more collectives than Flight Recorder's ring holds
    pytest.param("megatron-tp"),  # megatron-core ColumnParallelLinear + RowParallelLinear
]
NEEDS = dict.fromkeys(("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-accum"), "deepspeed")
NEEDS["accelerate"] = "accelerate"
NEEDS["hf-trainer"] = "transformers"
NEEDS["lightning"] = "lightning"
NEEDS["megatron-tp"] = "megatron.core"
WORLDS = {"ddp-4": 4}  # ranks per row; 2 otherwise
# Flight Recorder's ring per row (TORCH_FR_BUFFER_SIZE; 4000 otherwise) and steps per row (STEPS otherwise):
# torch TP issues one collective a step here, so 60 steps overtake a 16-entry ring almost four times
RING_ENTRIES = {"torch-tp": 16}
STEPS_OF = {"torch-tp": 60}
# forwards a step, each with the plant's sleep: the rows that accumulate micro-batches pay it per micro-batch
FORWARDS_PER_STEP = {"fsdp2": 2, "deepspeed-accum": 2}


def steps_of(framework: str) -> int:
    return STEPS_OF.get(framework, STEPS)


def world_of(framework: str) -> int:
    return WORLDS.get(framework, WORLD)


def run(trace_dir, framework: str, slow_ms: float) -> dict[int, dict]:
    args = [str(HERE / "job.py"), str(trace_dir), "--framework", framework, "--steps", str(steps_of(framework))]
    args += ["--slow-rank", str(SLOW_RANK), "--slow-ms", str(slow_ms)]
    results = run_ranks(
        args,
        world_of(framework),
        env={
            "TORCHELASTIC_RUN_ID": "diag-matrix",
            "DS_ACCELERATOR": "cpu",
            "TORCH_FR_BUFFER_SIZE": str(RING_ENTRIES.get(framework, 4000)),
        },
        timeout_s=400,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "diag.instrument does not know" not in result.stderr and "could not instrument" not in result.stderr
    return {r: json.loads((trace_dir / "truth" / f"rank{r}.json").read_text()) for r in range(world_of(framework))}


@pytest.fixture(scope="module", params=ROWS)
def row(request, tmp_path_factory):
    framework = request.param
    if framework in NEEDS:
        pytest.importorskip(NEEDS[framework])
    base_dir, slow_dir = tmp_path_factory.mktemp(f"{framework}-base"), tmp_path_factory.mktemp(f"{framework}-slow")
    base_truths, slow_truths = run(base_dir, framework, 0.0), run(slow_dir, framework, SLOW_MS)
    return framework, (base_dir, base_truths), (slow_dir, slow_truths)


def measured_slowdown_s(base_truths, slow_truths) -> float:
    """What the planted rank costs the job a step: the step time with it minus without it (rank 0's clock)."""
    base = statistics.median(base_truths[0]["step_times_s"][WARMUP:])
    slow = statistics.median(slow_truths[0]["step_times_s"][WARMUP:])
    return slow - base


def test_steps_and_phases_cover_the_step(row):
    framework, _, (slow_dir, truths) = row
    trace = diag.load(slow_dir)
    assert trace.ranks_found == list(range(world_of(framework)))
    for rank in range(world_of(framework)):
        steps = rank_steps(trace, rank)
        assert steps["step"].tolist() == list(range(truths[rank]["steps"]))
        for phase in ("forward_us", "backward_us", "optimizer_us"):
            assert (steps[phase] > 0).all(), (framework, rank, phase)
        inner = steps["forward_us"] + steps["backward_us"] + steps["optimizer_us"]
        assert (inner <= steps["duration_us"] + 5).all()  # rounding: 1 us each
        # the phases hold the framework's work (ZeRO's reduction, the optimizer step): what is left is diag's
        # step bookkeeping and the loss; before DeepSpeed engines were understood ZeRO-1 covered 1.8 of 41.5 ms
        assert (inner[WARMUP:] / steps["duration_us"][WARMUP:]).median() > 0.8, (framework, rank)


def test_deepspeed_engine_restored_at_finish(row):
    framework, _, (_, truths) = row
    if not framework.startswith("deepspeed"):
        pytest.skip("DeepSpeed rows only")
    assert all(truth["restored"]["deepspeed"] for truth in truths.values())


def test_collectives_per_step_match_flight_recorder(row):
    framework, _, (slow_dir, truths) = row
    trace = diag.load(slow_dir)
    for rank in range(world_of(framework)):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ours = (
            colls[colls["step"] >= 0].groupby("step").size().reindex(range(steps_of(framework)), fill_value=0).tolist()
        )
        assert ours == truths[rank]["fr_collectives_per_step"], (framework, rank)
        assert all(n > 0 for n in ours)  # every framework here communicates every step
    if framework in RING_ENTRIES:  # the job ran more collectives than the ring holds: none was lost
        assert sum(truths[0]["fr_collectives_per_step"]) > 2 * truths[0]["fr_ring_entries"]


def test_straggler_rank_cause_and_cost(row):
    framework, (_, base_truths), (slow_dir, slow_truths) = row
    report = analyze_json(slow_dir)
    stragglers = report["stragglers"]
    persistent = [s for s in stragglers if s["persistent"]]
    assert persistent and persistent[0]["rank"] == SLOW_RANK, (framework, stragglers)  # the costliest
    # Any other rank named is this machine's noise, true but nothing like the plant: a rank descheduled for a
    # moment (transient), or, with 4 ranks on 2 cores, one that shared its core more than the others all run
    # long (persistent, +19% work and 1 ms in one full-suite run). Only the plant may cost like one.
    others = [s for s in stragglers if s["rank"] != SLOW_RANK]
    assert all(s["time_saved_per_step_s"] < 0.25 * SLOW_MS / 1000 for s in others), (framework, others)
    straggler = persistent[0]
    assert straggler["cause"] == "compute"
    slowdown_s = measured_slowdown_s(base_truths, slow_truths)
    assert slowdown_s > 0.5 * SLOW_MS / 1000  # the plant really slowed the job
    truths_s = cost_truths_s(slowdown_s, FORWARDS_PER_STEP.get(framework, 1) * SLOW_MS / 1000)
    assert any(straggler["time_saved_per_step_s"] == pytest.approx(t, rel=0.25) for t in truths_s), (
        framework,
        straggler["time_saved_per_step_s"],
        truths_s,
    )


def test_memory_by_category_is_recorded(row):
    """Every framework's model and optimizer are counted (docs/memory.md): parameters and optimizer state on
    every rank at every step, and the manifest's memory_model for diag memory-plan."""
    framework, _, (slow_dir, _) = row
    trace = diag.load(slow_dir)
    memory = trace.memory[trace.memory["step"] >= 0]
    assert len(memory) and (memory["param_bytes"] > 0).all() and (memory["optimizer_state_bytes"] > 0).all(), framework
    assert all(m.memory_model is not None and m.memory_model.params_local for m in trace.manifests.values()), framework


def test_baseline_has_no_costly_straggler(row):
    """Without the plant, no rank costs the job anything like it. (A rank a millisecond slower from this
    loaded 2-core machine's noise may be listed; one costing a quarter of the plant would be a false finding.)"""
    framework, (base_dir, _), _ = row
    for straggler in analyze_json(base_dir)["stragglers"]:
        assert straggler["time_saved_per_step_s"] < 0.25 * SLOW_MS / 1000, (framework, straggler)
