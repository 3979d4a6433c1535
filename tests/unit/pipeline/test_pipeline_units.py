"""Fast checks: the theoretical figures, a run without pipelining, and capture's promises (instance-only
wrapping undone at finish, failures are one warning, the manual API's contract) on a one-stage pipeline in
this process."""

import warnings

import pytest

import diag
from diag._warn import DiagWarning
from diag.analysis.bubble import analyze_bubble, theoretical_fraction
from tests.conftest import REPO, requires_gpu


@pytest.mark.parametrize(
    "schedule, p, m, v, expected",
    [
        ("ScheduleGPipe", 4, 8, 1, 3 / 11),
        ("Schedule1F1B", 2, 4, 1, 1 / 5),
        ("ScheduleInterleaved1F1B", 4, 8, 2, 3 / 19),
        ("manual-gpipe", 8, 32, 1, 7 / 39),
        ("ScheduleLoopedBFS", 4, 8, 2, None),
        (None, 4, 8, 1, None),
    ],
)
def test_theoretical_fraction(schedule, p, m, v, expected):
    value, text = theoretical_fraction(schedule, p, m, v)
    assert value == (pytest.approx(expected) if expected is not None else None)
    assert text


def test_zero_bubble_figures_from_measured_times():
    equal = {"forward": 0.01, "backward_input": 0.01, "backward_weight": 0.01}
    zbv, _ = theoretical_fraction("ScheduleZBVZeroBubble", 4, 8, 2, equal)
    zb1p, _ = theoretical_fraction("ScheduleInterleavedZeroBubble", 4, 8, 1, equal)
    assert zbv == 0.0  # ZB-V: no bubble when F = B = W (Qi et al. 2023, sec. 6)
    assert zb1p == pytest.approx(3 * 0.01 / (3 * 0.01 + 8 * 0.03))  # a third of 1F1B's bubble time
    assert theoretical_fraction("ScheduleZBVZeroBubble", 4, 8, 2, {})[0] is None


def test_run_without_pipelining_has_no_bubble_report():
    trace = diag.load(REPO / "sample_traces" / "straggler")
    assert trace.microbatches.empty
    assert analyze_bubble(trace) is None


def test_manual_api_without_init_does_nothing_and_rejects_unknown_actions():
    with diag.pipeline_action("forward", 0):
        pass
    diag.pipeline_layout(schedule="x", stages=2, microbatches=4)
    with pytest.raises(ValueError, match="recv_wait"):
        diag.pipeline_action("fwd", 0)


@pytest.fixture
def one_stage_world(tmp_path):
    """A one-rank gloo world in this process (no other test here initialises one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield tmp_path
    dist.destroy_process_group()


def one_stage_schedule():
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, 2, loss_fn=lambda out, target: (out - target).square().mean())
    return stage, schedule


def test_wrapping_is_per_instance_and_undone_at_finish(one_stage_world):
    import torch

    stage, schedule = one_stage_schedule()
    other_stage, _ = one_stage_schedule()
    diag.init(one_stage_world / "trace", telemetry=False, watchdog=False, clock_sync=False)
    diag.instrument(schedule)
    with pytest.warns(DiagWarning, match="already instrumented"):
        diag.instrument(schedule)  # twice: ignored, not wrapped twice (rows would be doubled)
    assert "forward_one_chunk" in vars(stage) and "forward_one_chunk" not in vars(other_stage)
    with diag.step():
        schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))
    diag.finish()
    assert not {"forward_one_chunk", "backward_one_chunk", "get_fwd_recv_ops"} & set(vars(stage))
    assert "step" not in vars(schedule)
    rows = diag.load(one_stage_world / "trace").microbatches
    assert rows["action"].astype(str).tolist() == ["forward", "forward", "backward", "backward"]
    assert rows["microbatch"].tolist() == [0, 1, 0, 1] and (rows["step"] == 0).all()


def test_capture_failure_is_one_warning_and_training_goes_on(one_stage_world):
    import torch

    _stage, schedule = one_stage_schedule()
    session = diag.init(one_stage_world / "trace", telemetry=False, watchdog=False, clock_sync=False)
    diag.instrument(schedule)

    def broken(*_args):
        raise OSError("disk gone")

    session.device_timer.stop = broken
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            schedule.step(torch.randn(4, 4), target=torch.randn(4, 4), losses=losses)
    diag.finish()
    assert len(losses) == 2  # the second step's two micro-batch losses: training ran
    pipeline_warnings = [w for w in caught if issubclass(w.category, DiagWarning) and "pipeline" in str(w.message)]
    assert len(pipeline_warnings) == 1


def test_instrumenting_a_broken_schedule_warns_instead_of_raising(one_stage_world):
    _stage, schedule = one_stage_schedule()
    del schedule._stage  # a schedule diag cannot read
    diag.init(one_stage_world / "trace", telemetry=False, watchdog=False, clock_sync=False)
    with pytest.warns(DiagWarning, match="could not instrument ScheduleGPipe"):
        diag.instrument(schedule)
    diag.finish()


@pytest.fixture
def one_gpu_world(tmp_path):
    """A one-rank NCCL world (gloo cannot send to its own rank, which a one-rank pipeline may do)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield tmp_path
    dist.destroy_process_group()


@requires_gpu
def test_gpu_actions_carry_cuda_event_times(one_gpu_world):
    """Two chunks on one rank (interleaved 1F1B, the chunks hand over locally): every compute row gets its
    CUDA-event time, resolved without host syncs and written by finish at the latest."""
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    device = torch.device("cuda", 0)
    stages = [PipelineStage(torch.nn.Linear(256, 256).to(device), i, 2, device) for i in range(2)]
    schedule = ScheduleInterleaved1F1B(stages, 4, loss_fn=lambda out, target: (out - target).square().mean())
    diag.init(one_gpu_world / "trace", telemetry=False, watchdog=False, clock_sync=False, device=device)
    diag.instrument(schedule)
    x, target = torch.randn(64, 256, device=device), torch.randn(64, 256, device=device)
    for _ in range(3):
        with diag.step():
            schedule.step(x, target=target)
    diag.finish()
    rows = diag.load(one_gpu_world / "trace").microbatches
    compute = rows[rows["action"].astype(str).isin(["forward", "backward"])]
    assert len(compute) == 3 * 2 * 4 * 2  # steps x chunks x micro-batches x (forward, backward)
    assert compute["device_us"].notna().all() and (compute["device_us"] > 0).all()
    assert set(compute["virtual_stage"]) == {0, 1} and set(compute["stage"]) == {0}


def _pipeline_sample_with(tmp_path, edit_stage_rows) -> "diag.Trace":
    """The bundled pipeline sample (4 stages, stage 2 computing twice as long), its stage-2 microbatches rows
    given a run-queue wait column by ``edit_stage_rows(row) -> wait_us``."""
    import shutil

    trace_dir = tmp_path / "pipeline"
    shutil.copytree(REPO / "sample_traces" / "pipeline", trace_dir)
    for path in trace_dir.glob("rank*/microbatches.csv"):
        header, columns, *rows = path.read_text().splitlines()
        names = columns.split(",")
        edited = []
        for line in rows:
            row = dict(zip(names, line.split(",")))
            wait_us = edit_stage_rows(row) if row["stage"] == "2" else 0
            edited.append(f"{line},{wait_us}")
        path.write_text("\n".join([header, columns + ",runqueue_wait_us", *edited]) + "\n")
    return diag.load(trace_dir)


def test_a_stage_slower_only_by_waiting_for_a_core_is_no_imbalance(tmp_path):
    """On a CPU host with more runnable threads than cores a stage's actions can take longer only because its
    thread waited for a core (in 1F1B, the last stage's back-to-back forward and backward). Stage 2's extra half
    of each compute action recorded as run-queue wait: its work equals the others', and it is not named."""
    compute = {"forward", "backward"}
    trace = _pipeline_sample_with(tmp_path, lambda row: int(row["duration_us"]) // 2 if row["action"] in compute else 0)
    report = analyze_bubble(trace)
    stage_2 = next(s for s in report.per_stage if s.stage == 2)
    assert stage_2.busy_s > 1.8 * stage_2.work_s  # the wall time still shows what the pipeline did
    assert abs(report.slowest_stage_excess_fraction) < 0.1 and not report.imbalanced


def test_a_stage_with_more_work_is_named_whatever_its_core_waits(tmp_path):
    trace = _pipeline_sample_with(tmp_path, lambda row: 0)
    report = analyze_bubble(trace)
    assert report.imbalanced and report.slowest_stage == 2
    assert report.slowest_stage_excess_fraction == pytest.approx(0.98, abs=0.05)


def test_an_imbalance_seen_in_fewer_than_three_steps_is_no_evidence():
    """A run killed after two steps: a one- or two-step median has no spread to measure, which read as
    infinite evidence and named a stage of a healthy 8-stage job."""
    trace = diag.load(REPO / "sample_traces" / "pipeline")
    report = analyze_bubble(trace, window_steps=[1, 2])
    assert report.slowest_stage == 2 and report.slowest_stage_excess_fraction > 0.5
    assert report.slowest_stage_evidence_z == 0.0 and not report.imbalanced
