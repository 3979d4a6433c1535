import json
import time

import pytest
import torch

import diag
from diag._warn import DiagWarning


def test_flops_counted_once_with_flop_counter(tmp_path):
    batch, features_in, features_out = 32, 64, 16
    model = torch.nn.Linear(features_in, features_out, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(tmp_path, telemetry=False, count_flops=True)
    diag.instrument(model, optimizer)
    for _ in range(3):
        with diag.step():
            model(torch.randn(batch, features_in)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    # forward 2·B·I·O, backward only the weight gradient (the input needs none): 2·B·I·O
    assert manifest.flops_per_step == 4 * batch * features_in * features_out
    assert manifest.flops_source == "flop_counter"


def test_user_flops_are_not_recounted(tmp_path):
    diag.init(tmp_path, telemetry=False, count_flops=True, flops_per_step=123.0)
    for _ in range(3):
        with diag.step():
            torch.randn(8, 8) @ torch.randn(8, 8)
    diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    assert manifest.flops_per_step == 123.0 and manifest.flops_source == "user"


def test_no_gpu_means_telemetry_off_with_a_reason(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: telemetry is on")
    session = diag.init(tmp_path)
    diag.finish()
    status = diag.load(tmp_path).manifest(0).capture
    assert status["telemetry"].startswith("off: no CUDA device") and status["device_time"].startswith("off")
    assert session.telemetry is None


def test_misspelt_option_is_an_error_but_a_failing_init_is_a_warning(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="flops_per_stpe"):
        diag.init(tmp_path, flops_per_stpe=1.0)

    def broken_identity():
        raise RuntimeError("launcher environment unreadable")

    monkeypatch.setattr("diag.capture.session.detect_identity", broken_identity)
    with pytest.warns(DiagWarning, match="launcher environment unreadable"):
        session = diag.init(tmp_path)
    assert not session.enabled
    with diag.step():  # the job runs on without capture
        pass


BACKWARD_SLEEP_S = 0.02


class _SleepInBackward(torch.autograd.Function):
    """Identity whose backward sleeps BACKWARD_SLEEP_S: time every recorded backward must hold, however long a
    loaded machine keeps the thread waiting around it."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(BACKWARD_SLEEP_S)
        return grad


def _two_model_steps(tmp_path, steps: int = 6):
    """A generator and a critic trained together, both instrumented; returns the recorded steps and the
    backward calls' own wall times, measured around them."""
    torch.manual_seed(0)
    generator, critic = torch.nn.Linear(512, 512), torch.nn.Linear(512, 1)
    optimizer = torch.optim.SGD([*generator.parameters(), *critic.parameters()], lr=1e-3)
    diag.init(tmp_path, telemetry=False)
    diag.instrument(generator, critic, optimizer)
    measured_us = []
    for _ in range(steps):
        with diag.step():
            loss = critic(_SleepInBackward.apply(generator(torch.randn(512, 512)))).pow(2).mean()
            started = time.perf_counter_ns()
            loss.backward()
            measured_us.append((time.perf_counter_ns() - started) / 1000)
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    return diag.load(tmp_path).steps, measured_us


def test_backward_is_timed_once_however_many_models_are_instrumented(tmp_path):
    steps, measured_us = _two_model_steps(tmp_path)
    recorded_us = steps["backward_us"].to_numpy()
    # the recorded span lies inside the measured one; timed once per model it would be about twice as long
    assert (recorded_us <= [m + 1 for m in measured_us]).all()
    # and it holds the sleep inside the backward (a bound a preemption between the two timings cannot break)
    assert (recorded_us >= BACKWARD_SLEEP_S * 1e6).all(), (recorded_us, measured_us)


def test_backward_outside_capture_and_after_finish_records_nothing(tmp_path):
    _two_model_steps(tmp_path / "run", steps=2)
    model = torch.nn.Linear(4, 1)
    model(torch.randn(2, 4)).sum().backward()  # the wrapper stays installed, with nobody listening
    assert model.weight.grad is not None
    diag.init(tmp_path / "second", telemetry=False)  # a session that instrumented no model
    with diag.step():
        model(torch.randn(2, 4)).sum().backward()
    diag.finish()
    assert diag.load(tmp_path / "second").steps["backward_us"].fillna(0).tolist() == [0]


def test_error_inside_backward_propagates_and_the_phase_is_closed(tmp_path):
    model = torch.nn.Linear(4, 1)
    session = diag.init(tmp_path, telemetry=False)
    diag.instrument(model)
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), diag.step():
        loss.backward()
    assert session.current_phase is None
    diag.finish()


class _BackwardInAnotherThread(torch.autograd.Function):
    """Identity whose backward runs a second backward on another thread, as reentrant activation checkpointing
    does on the autograd engine's device threads."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        import threading

        def inner_backward():
            layer = torch.nn.Linear(1024, 1024)
            with torch.enable_grad():
                for _ in range(3):
                    layer(torch.randn(512, 1024)).sum().backward()

        thread = threading.Thread(target=inner_backward)
        thread.start()
        thread.join()
        return grad


def test_backward_started_inside_another_is_part_of_it(tmp_path):
    import time

    model = torch.nn.Linear(64, 64)
    diag.init(tmp_path, telemetry=False)
    diag.instrument(model)
    measured_us = []
    for _ in range(3):
        with diag.step():
            loss = _BackwardInAnotherThread.apply(model(torch.randn(32, 64))).sum()
            started = time.perf_counter_ns()
            loss.backward()
            measured_us.append((time.perf_counter_ns() - started) / 1000)
    diag.finish()
    recorded_us = diag.load(tmp_path).steps["backward_us"].to_numpy()
    # counted again, the inner backward (most of the time) would take the recorded span past the measured one
    assert (recorded_us <= [m + 1 for m in measured_us]).all(), (recorded_us, measured_us)
    # and it holds the sleep inside the backward (a bound a preemption between the two timings cannot break)
    assert (recorded_us >= BACKWARD_SLEEP_S * 1e6).all(), (recorded_us, measured_us)


class _Sleeps(torch.nn.Module):
    def forward(self, x):
        time.sleep(0.05)
        return x * 2


def test_a_phase_named_forward_around_the_model_counts_its_time_once(tmp_path):
    """``with diag.phase("forward"): model(x)`` on an instrumented model: the forward hook's time lies inside the
    user's span and is not added again (counted twice, forward_us would exceed the whole step)."""
    model = _Sleeps()
    diag.init(tmp_path, telemetry=False, watchdog=False)
    diag.instrument(model)
    for _ in range(2):
        with diag.step():
            with diag.phase("forward"):
                model(torch.ones(2))
            with diag.phase("compute"):  # a name of the user's own: still its own span
                model(torch.ones(2))
    diag.finish()
    steps = diag.load(tmp_path).steps
    assert ((steps["forward_us"] > 0.09e6) & (steps["forward_us"] < steps["duration_us"])).all(), steps


def test_a_restart_into_the_same_directory_numbers_its_hang_dumps_after_the_earlier_attempt_s(tmp_path):
    """torchrun --max-restarts writes every attempt into one directory: the attempt before's dumps (its uncaught
    error's stacks) stay, and the new ones come after them, so triage reads the latest as the latest."""
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    (rank_dir / "hang_dump_001.json").write_text('{"reason": "uncaught RuntimeError"}')
    (rank_dir / "hang_dump_002.json").write_text('{"reason": "process exiting without diag.finish"}')
    diag.init(tmp_path, telemetry=False, hang_threshold_s=60)
    try:
        diag.session().watchdog.dump("signal SIGTERM")
    finally:
        diag.finish()
    assert (rank_dir / "hang_dump_001.json").read_text() == '{"reason": "uncaught RuntimeError"}'
    assert json.loads((rank_dir / "hang_dump_003.json").read_text())["reason"] == "signal SIGTERM"
    assert (rank_dir / "stacks_003.txt").exists()
