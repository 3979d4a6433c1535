"""DiagTrainerCallback in real Hugging Face Trainer runs: a 2-rank DDP job (ranks started with torchrun's
variables) with gradient accumulation, and a single-process run with evaluation between steps, in this
process."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import diag  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402
    analyze_json,
    assert_phases_inside_steps,
    assert_same_collectives_on_every_rank,
    rank_steps,
    run_job,
)
from tests.integrations.huggingface_job import (  # noqa: E402
    BATCH,
    SEQ,
    train,  # noqa: E402
)

WORLD, STEPS, ACCUMULATE = 2, 3, 2


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("huggingface_ddp")
    truths = run_job(trace_dir, "huggingface_job.py", WORLD, STEPS, ACCUMULATE)
    return trace_dir, diag.load(trace_dir), truths


@pytest.mark.slow
def test_ddp_one_step_per_optimizer_step_with_its_micro_batches(ddp_run):
    _, trace, truths = ddp_run
    assert trace.ranks_found == [0, 1] and trace.skipped == []
    for rank in range(WORLD):
        assert truths[rank]["global_step"] == STEPS and truths[rank]["session_closed"]
        steps = rank_steps(trace, rank)
        assert steps["step"].tolist() == list(range(truths[rank]["global_step"]))
        assert (steps["samples"] == ACCUMULATE * BATCH).all()  # every micro-batch the model saw
        assert (steps["tokens"] == ACCUMULATE * BATCH * SEQ).all()  # from input_ids
        assert_phases_inside_steps(steps)
        assert (steps["data_wait_us"] > 0).all()


@pytest.mark.slow
def test_ddp_gradient_buckets_recorded_once_per_step_with_all_gradients(ddp_run):
    _, trace, truths = ddp_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ddp = colls[colls["source"] == "ddp"]
        per_step = ddp.groupby("step")["bytes"].sum()
        # found through the DDP wrapper at the first forward; no_sync on the first micro-batch
        assert per_step.index.tolist() == list(range(STEPS))
        assert (per_step == truths[rank]["param_bytes"]).all()
        # diag's default on gloo: buckets read from Flight Recorder (untimed), the exposed wait timed per step
        assert ddp["duration_us"].isna().all() and ddp["seq"].is_unique
        assert (trace.steps[trace.steps["rank"] == rank]["comm_wait_us"] > 0).all()
    assert_same_collectives_on_every_rank(trace, WORLD)


@pytest.mark.slow
def test_ddp_manifest_and_analyze(ddp_run):
    trace_dir, trace, truths = ddp_run
    for rank in range(WORLD):
        manifest = trace.manifest(rank)
        assert manifest.rank == rank and manifest.world_size == truths[rank]["world_size"] == WORLD
        assert manifest.backend == "gloo" and manifest.finished
    run = analyze_json(trace_dir)["run"]
    assert run["world_size"] == WORLD and run["ranks_found"] == [0, 1] and run["steps"] == STEPS


WORLD, STEPS, ACCUMULATE = 2, 3, 2


def test_single_process_evaluation_between_steps_is_not_counted_in_them(tmp_path):
    trainer = train(tmp_path, max_steps=4, eval_every=1)  # an evaluation pass after every step
    assert not diag.session().enabled
    trace = diag.load(tmp_path)
    assert trace.ranks_found == [0] and trace.manifest(0).world_size == 1
    steps = rank_steps(trace, 0)
    assert steps["step"].tolist() == list(range(trainer.state.global_step)) == [0, 1, 2, 3]
    assert (steps["samples"] == BATCH).all()  # the evaluation's 16 batches are not counted
    assert_phases_inside_steps(steps)  # nor their forward time
    assert trace.collectives.empty
    # each step's loss, as the Trainer logged it (logging_steps=1; it rounds to 4 digits)
    logged = {entry["step"] - 1: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
    assert sorted(logged) == steps["step"].tolist()
    assert steps["loss"].tolist() == pytest.approx([logged[s] for s in steps["step"]], rel=1e-3, abs=1e-4)
