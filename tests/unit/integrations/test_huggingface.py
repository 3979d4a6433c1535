"""DiagTrainerCallback in real Hugging Face Trainer runs: a 2-rank DDP job (ranks started with torchrun's
variables) with gradient accumulation, and a single-process run with evaluation between steps, in this
process."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import diag  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402
    assert_phases_inside_steps,
    rank_steps,
)
from tests.integrations.huggingface_job import BATCH, train  # noqa: E402

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
