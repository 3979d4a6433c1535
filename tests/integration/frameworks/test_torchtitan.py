"""The torchtitan row of the framework matrix: torchtitan's own ``Trainer`` (llama3 ``debugmodel``, FSDP2 over 2
gloo ranks, tests/frameworks/torchtitan_job.py) adopted as docs/frameworks.md says, run twice, as a baseline and
with rank 1 planted slower in its forward. The checks are the matrix's (tests/integration/frameworks/
test_matrix.py): steps, phases covering the step, collectives per step against the rank's own Flight Recorder,
memory by category, the straggler's rank, cause and cost, and no costly straggler in the baseline.

The plant is 400 ms, not the matrix's 40: a torchtitan step here is ~0.5-0.9 s of real transformer compute, and
on a loaded 2-core machine its step times swing by ~40% from step to step, so a smaller plant is within the
noise diag estimates for the run (with 150 ms it named no straggler). Both runs take ~35 s each (most of it
importing torchtitan and building the trainer).
"""

import json
import statistics

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (the frameworks extra)")

import diag  # noqa: E402
from diag.launch import run_ranks  # noqa: E402
from tests.analysis.helpers import cost_truths_s  # noqa: E402
from tests.frameworks import HERE  # noqa: E402
from tests.integrations.helpers import analyze_json, rank_steps  # noqa: E402

WORLD, STEPS, SLOW_RANK, SLOW_MS = 2, 10, 1, 400.0
WARMUP = 2  # the first steps: lazy initialisation, left out of the medians


def run(trace_dir, slow_ms: float) -> dict[int, dict]:
    args = [str(HERE / "torchtitan_job.py"), str(trace_dir), "--steps", str(STEPS)]
    args += ["--slow-rank", str(SLOW_RANK), "--slow-ms", str(slow_ms)]
    env = {"TORCHELASTIC_RUN_ID": "diag-torchtitan", "TORCH_FR_BUFFER_SIZE": "4000"}
    results = run_ranks(args, WORLD, env=env, timeout_s=400)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "diag.instrument does not know" not in result.stderr and "could not instrument" not in result.stderr
    return {r: json.loads((trace_dir / "truth" / f"rank{r}.json").read_text()) for r in range(WORLD)}


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    base_dir, slow_dir = tmp_path_factory.mktemp("torchtitan-base"), tmp_path_factory.mktemp("torchtitan-slow")
    return (base_dir, run(base_dir, 0.0)), (slow_dir, run(slow_dir, SLOW_MS))


def test_steps_and_phases_cover_the_step(row):
    _, (slow_dir, truths) = row
    trace = diag.load(slow_dir)
    assert trace.ranks_found == list(range(WORLD))
    for rank in range(WORLD):
        steps = rank_steps(trace, rank)
        assert truths[rank]["steps"] == STEPS
        assert steps["step"].tolist() == list(range(STEPS))  # one diag step per torchtitan train_step
        for phase in ("forward_us", "backward_us", "optimizer_us"):
            assert (steps[phase] > 0).all(), (rank, phase)
        inner = steps["forward_us"] + steps["backward_us"] + steps["optimizer_us"]
        assert (inner <= steps["duration_us"] + 5).all()
        # what is left is torchtitan's own step work outside the model and the optimizer: moving the batch,
        # the token count's all_reduce, the loss and grad-norm metrics it logs every step
        assert (inner[WARMUP:] / steps["duration_us"][WARMUP:]).median() > 0.8, rank
        # diag's step is the job's own timing of train_step, within the bookkeeping around it
        ours_s = steps["duration_us"].to_numpy() / 1e6
        assert all(abs(a - b) < 0.05 * b + 0.005 for a, b in zip(ours_s, truths[rank]["step_times_s"])), rank


def test_collectives_per_step_match_flight_recorder(row):
    _, (slow_dir, truths) = row
    trace = diag.load(slow_dir)
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ours = colls[colls["step"] >= 0].groupby("step").size().reindex(range(STEPS), fill_value=0).tolist()
        assert ours == truths[rank]["fr_collectives_per_step"], rank
        # FSDP2's all-gathers and reduce-scatters of 6 blocks and the root, torchtitan's token-count all_reduce
        assert all(n >= 14 for n in ours), ours
        ops = set(colls[colls["step"] >= 0]["op"])
        assert {"all_gather", "reduce_scatter", "all_reduce"} <= {op.split("_into")[0].replace("_base", "")
                                                                 for op in ops}, ops  # fmt: skip


def test_straggler_rank_cause_and_cost(row):
    (_, base_truths), (slow_dir, slow_truths) = row
    stragglers = analyze_json(slow_dir)["stragglers"]
    persistent = [s for s in stragglers if s["persistent"]]
    assert persistent and persistent[0]["rank"] == SLOW_RANK, stragglers
    others = [s for s in stragglers if s["rank"] != SLOW_RANK]
    assert all(s["time_saved_per_step_s"] < 0.25 * SLOW_MS / 1000 for s in others), others
    straggler = persistent[0]
    assert straggler["cause"] == "compute"
    base = statistics.median(base_truths[0]["step_times_s"][WARMUP:])
    slow = statistics.median(slow_truths[0]["step_times_s"][WARMUP:])
    truths_s = cost_truths_s(slow - base, SLOW_MS / 1000)
    assert any(straggler["time_saved_per_step_s"] == pytest.approx(t, rel=0.25) for t in truths_s), (
        straggler["time_saved_per_step_s"],
        truths_s,
    )


def test_memory_by_category_is_recorded(row):
    _, (slow_dir, _) = row
    trace = diag.load(slow_dir)
    memory = trace.memory[trace.memory["step"] >= 0]
    assert len(memory) and (memory["param_bytes"] > 0).all() and (memory["optimizer_state_bytes"] > 0).all()
    assert all(m.memory_model is not None and m.memory_model.params_local for m in trace.manifests.values())


def test_baseline_has_no_costly_straggler(row):
    (base_dir, _), _ = row
    for straggler in analyze_json(base_dir)["stragglers"]:
        assert straggler["time_saved_per_step_s"] < 0.25 * SLOW_MS / 1000, straggler
