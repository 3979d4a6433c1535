"""megatron-core pipeline parallelism (issue 13 item 5): a real 2-stage ``forward_backward_pipelining_without_
interleaving`` job (tests/frameworks/megatron_job.py, gloo, the narrow CUDA-to-CPU shim explained there) with
stage 1 planted 30 ms slower per micro-batch forward, instrumented with ``diag.instrument(schedules)`` only."""

import json

import pytest

pytest.importorskip("megatron.core")

import diag  # noqa: E402
from diag.launch import run_ranks  # noqa: E402
from tests.frameworks import HERE  # noqa: E402
from tests.integrations.helpers import analyze_json  # noqa: E402

WORLD, STEPS, MICROBATCHES, SLOW_STAGE, SLOW_MS = 2, 5, 4, 1, 30.0


def _run(trace_dir, *extra: str):
    args = [str(HERE / "megatron_job.py"), str(trace_dir), "--steps", str(STEPS), "--microbatches", str(MICROBATCHES)]
    results = run_ranks(args + list(extra), WORLD, env={"TORCHELASTIC_RUN_ID": "diag-megatron"}, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "diag.instrument does not know" not in result.stderr
    truths = {r: json.loads((trace_dir / "truth" / f"rank{r}.json").read_text()) for r in range(WORLD)}
    return trace_dir, diag.load(trace_dir), truths


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("megatron-pp"), "--slow-stage", str(SLOW_STAGE), "--slow-ms", str(SLOW_MS))


def test_every_microbatch_forward_and_backward_on_every_stage(slow_run):
    _, trace, truths = slow_run
    mb = trace.microbatches
    for rank in range(WORLD):
        stage = truths[rank]["stage"]
        ours = mb[mb["rank"] == rank]
        assert (ours["stage"] == stage).all()
        for step in range(STEPS):
            in_step = ours[ours["step"] == step]
            for action in ("forward", "backward"):
                rows = in_step[in_step["action"] == action].sort_values("start_us")
                assert rows["microbatch"].tolist() == list(range(MICROBATCHES)), (rank, step, action)
    # the planted sleep is in stage 1's forwards, and stage 0 waits for it in its receives
    forward = mb[mb["action"] == "forward"].groupby("stage")["duration_us"].median()
    assert forward[SLOW_STAGE] >= SLOW_MS * 1000 > 10 * forward[0]
    stage0_recv_us = mb[(mb["stage"] == 0) & (mb["action"] == "recv_wait")].groupby("step")["duration_us"].sum()
    assert (stage0_recv_us >= 0.5 * MICROBATCHES * SLOW_MS * 1000).all()
    assert set(mb["microbatch"]) == set(range(MICROBATCHES))  # waits are placed on real micro-batches


def test_bubble_and_slow_stage_reported(slow_run):
    trace_dir, _, _ = slow_run
    bubble = analyze_json(trace_dir)["bubble"]
    assert bubble is not None  # was null before megatron's schedules were hooked
    assert (bubble["schedule"], bubble["stages"], bubble["microbatches"]) == ("megatron-1F1B", WORLD, MICROBATCHES)
    assert bubble["slowest_stage"] == SLOW_STAGE
    assert bubble["measured_fraction"] > bubble["theoretical_fraction"]  # the slow stage idles the other
    # stage 0 idles while stage 1 computes its 4 x 30 ms of planted forwards; at least half of it is lost
    assert bubble["slowest_stage_time_lost_per_step_s"] >= 0.5 * MICROBATCHES * SLOW_MS / 1000


@pytest.mark.slow
def test_baseline_pipeline_names_no_costly_slow_stage(tmp_path):
    """Without the plant, the stages are alike: whichever is slowest costs nothing like the plant, and the
    bubble left is about the schedule's own (p-1)/(m+p-1)."""
    trace_dir, _, _ = _run(tmp_path)
    bubble = analyze_json(trace_dir)["bubble"]
    assert bubble["slowest_stage_time_lost_per_step_s"] < 0.25 * MICROBATCHES * SLOW_MS / 1000, bubble


@pytest.mark.slow
def test_interleaved_schedule_slow_stage_reported(tmp_path):
    """megatron-core's interleaved 1F1B (2 model chunks per rank): every chunk's forwards recorded with its
    virtual stage, and the bubble report names the interleaved schedule and the slow stage."""
    slow = ["--slow-stage", str(SLOW_STAGE), "--slow-ms", str(SLOW_MS)]
    trace_dir, trace, _ = _run(tmp_path, "--chunks", "2", *slow)
    mb = trace.microbatches
    forwards = mb[mb["action"] == "forward"].groupby(["rank", "virtual_stage"]).size()
    assert forwards.to_dict() == {(0, 0): STEPS * MICROBATCHES, (0, 2): STEPS * MICROBATCHES,
                                  (1, 1): STEPS * MICROBATCHES, (1, 3): STEPS * MICROBATCHES}  # fmt: skip
    bubble = analyze_json(trace_dir)["bubble"]
    assert (bubble["schedule"], bubble["stages"], bubble["virtual_stages"]) == ("megatron-interleaved-1F1B", 2, 2)
    assert bubble["slowest_stage"] == SLOW_STAGE
    assert bubble["slowest_stage_time_lost_per_step_s"] >= 0.5 * MICROBATCHES * SLOW_MS / 1000
