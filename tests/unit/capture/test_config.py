"""diag.init's options as one dataclass (diag/capture/config.py): defaults, every validation message, the DIAG_*
environment variables and their precedence, unknown options, ``config=``, and the generated docs."""

import dataclasses
import math
import warnings
from pathlib import Path

import pytest

import diag
from diag._warn import DiagWarning, reset_for_tests
from diag.capture.config import (
    DEFAULT_FINGERPRINT_EVERY,
    CaptureConfig,
    env_variable,
    fields,
    option_problems,
    render_markdown,
)
from diag.trace.writer import DEFAULT_TRACE_FORMAT

REPO = Path(__file__).resolve().parents[3]
QUIET = {"telemetry": False, "watchdog": False, "clock_sync": False, "calibrate_every": 0}


class FakeRun:
    """Anything with ``log`` is taken as a W&B run; this one is never logged to (no session starts)."""

    def log(self, values, step=None):
        raise AssertionError("not a test of logging")


def test_defaults_are_what_the_docs_say():
    config = CaptureConfig()
    assert (config.telemetry, config.collectives, config.memory, config.clock_sync, config.watchdog) == (True,) * 5
    assert (config.count_flops, config.loggers_on_every_rank, config.nvtx, config.wandb) == (False,) * 4
    assert config.nccl_log is True and config.ddp_buckets == "auto"
    assert (config.telemetry_interval_s, config.hang_threshold_s, config.heartbeat_interval_s) == (1.0, 120.0, 5.0)
    assert config.flush_interval_s == 0.5 and config.fingerprint_every == DEFAULT_FINGERPRINT_EVERY
    assert config.trace_format == DEFAULT_TRACE_FORMAT and config.prometheus_addr == "0.0.0.0"
    nones = ("flops_per_step", "peak_tflops", "dtype", "parallel", "prometheus_port", "tensorboard")
    assert all(getattr(config, name) is None for name in (*nones, "model_shape", "memory_deep_steps", "device"))
    assert option_problems({f.name: getattr(config, f.name) for f in fields()}) == {}


def test_a_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CaptureConfig().telemetry = False


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("telemetry", 1, "telemetry must be True or False, not 1"),
        ("nccl_log", "yes", "nccl_log must be True or False, not 'yes'"),
        ("flush_interval_s", 0, "flush_interval_s must be a number of seconds >= 0.01, not 0"),
        ("telemetry_interval_s", math.inf, "telemetry_interval_s must be a number of seconds >= 0.01, not inf"),
        ("heartbeat_interval_s", "5", "heartbeat_interval_s must be a number of seconds >= 0.01, not '5'"),
        ("hang_threshold_s", True, "hang_threshold_s must be a number of seconds >= 0.01, not True"),
        ("flops_per_step", -5.0, "flops_per_step must be a positive number or None, not -5.0"),
        ("peak_tflops", 0, "peak_tflops must be a positive number or None, not 0"),
        ("dtype", 16, "dtype must be a string such as 'bf16' or None, not 16"),
        ("parallel", {"tp": 0}, "parallel must map dimension names to positive sizes"),
        ("parallel", [8], "parallel must map dimension names to positive sizes"),
        ("tensorboard", 3, "tensorboard must be a log directory or None, not 3"),
        ("wandb", "run", "wandb must be True (the active run), False or a W&B run object, not 'run'"),
        ("trace_format", 3, "trace_format must be one of (1, 2), not 3"),
        ("calibrate_every", -1, "calibrate_every must be a whole number of steps >= 0 (0: no calibration)"),
        ("fingerprint_every", 1.5, "fingerprint_every must be a whole number of steps >= 0 (0: off), not 1.5"),
        ("ddp_buckets", "hooks", "ddp_buckets must be one of ('auto', 'hook', 'flight_recorder', True, False)"),
        ("ddp_buckets", 1, "ddp_buckets must be one of"),
        ("prometheus_port", 70000, "prometheus_port must be a port number 0-65535 or None, not 70000"),
        ("prometheus_addr", 0, "prometheus_addr must be an address string, not 0"),
        ("model_shape", [1], "model_shape must be a dict such as"),
        ("model_shape", {"hidden": 0}, "model_shape['hidden'] must be a positive integer, not 0"),
        ("model_shape", {"dropout": 1}, "model_shape['dropout'] must be True or False, not 1"),
        ("model_shape", {"recompute": "some"}, "model_shape['recompute'] must be none, selective or full"),
        ("model_shape", {"width": 3}, "model_shape has unknown keys ['width']"),
        ("memory_deep_steps", (0, 11), "memory_deep_steps must be (first step >= 0, count 1-10) or None"),
    ],
)
def test_every_plainly_wrong_value_has_its_message(option, value, message):
    with pytest.raises(ValueError) as error:
        CaptureConfig(**{option: value})
    assert str(error.value).startswith("diag.init: ") and message in str(error.value)


def test_right_values_of_every_kind_are_accepted():
    config = CaptureConfig(
        flops_per_step=1e12,
        peak_tflops=989,
        dtype="bf16",
        parallel={"dp": 8, "tp": 4},
        ddp_buckets=True,
        prometheus_port=0,
        tensorboard=Path("tb"),
        wandb=FakeRun(),
        model_shape={"hidden": 4096, "layers": 32, "recompute": "full", "flash_attention": True},
        memory_deep_steps=(100, 3),
        trace_format=1,
        fingerprint_every=0,
    )
    assert config.parallel == {"dp": 8, "tp": 4} and config.memory_deep_steps == (100, 3)


def test_every_wrong_value_is_named_in_one_error():
    with pytest.raises(ValueError) as error:
        CaptureConfig(flush_interval_s=0, memory=1, peak_tflops=-1, ddp_buckets="x")
    assert all(name in str(error.value) for name in ("flush_interval_s", "memory", "peak_tflops", "ddp_buckets"))


# -- the environment --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "variable, text, option, value",
    [
        ("DIAG_TELEMETRY", "0", "telemetry", False),
        ("DIAG_NVTX", "Yes", "nvtx", True),
        ("DIAG_COLLECTIVES", "off", "collectives", False),
        ("DIAG_HANG_THRESHOLD_S", "60", "hang_threshold_s", 60.0),
        ("DIAG_FLUSH_INTERVAL_S", "0.25", "flush_interval_s", 0.25),
        ("DIAG_FINGERPRINT_EVERY", "0", "fingerprint_every", 0),
        ("DIAG_TRACE_FORMAT", "1", "trace_format", 1),
        ("DIAG_PROMETHEUS_PORT", "9400", "prometheus_port", 9400),
        ("DIAG_PROMETHEUS_PORT", "none", "prometheus_port", None),
        ("DIAG_FLOPS_PER_STEP", "1.5e12", "flops_per_step", 1.5e12),
        ("DIAG_DTYPE", "bf16", "dtype", "bf16"),
        ("DIAG_TENSORBOARD", "/tmp/tb", "tensorboard", "/tmp/tb"),
        ("DIAG_DDP_BUCKETS", "flight_recorder", "ddp_buckets", "flight_recorder"),
        ("DIAG_DDP_BUCKETS", "false", "ddp_buckets", False),
        ("DIAG_PARALLEL", '{"dp": 8, "tp": 4}', "parallel", {"dp": 8, "tp": 4}),
        ("DIAG_MODEL_SHAPE", '{"hidden": 64, "dropout": false}', "model_shape", {"hidden": 64, "dropout": False}),
        ("DIAG_MEMORY_DEEP_STEPS", "100,3", "memory_deep_steps", (100, 3)),
        ("DIAG_MEMORY_DEEP_STEPS", "7", "memory_deep_steps", (7, 1)),
        ("DIAG_WANDB", "1", "wandb", True),
        ("DIAG_DEVICE", "cpu", "device", "cpu"),
    ],
)
def test_a_variable_sets_its_option_with_its_type(variable, text, option, value):
    config = CaptureConfig.from_environment({variable: text})
    assert getattr(config, option) == value and type(getattr(config, option)) is type(value)
    others = {f.name: getattr(CaptureConfig(), f.name) for f in fields() if f.name != option}
    assert all(getattr(config, name) == default for name, default in others.items())


def test_every_option_has_a_variable_read_from_the_environment():
    assert all(f.metadata["parse"] is not None for f in fields())
    assert env_variable("hang_threshold_s") == "DIAG_HANG_THRESHOLD_S"


@pytest.mark.parametrize(
    "variable, text, why",
    [
        ("DIAG_TELEMETRY", "maybe", "expected one of"),
        ("DIAG_HANG_THRESHOLD_S", "a minute", "expected a number"),
        ("DIAG_HANG_THRESHOLD_S", "0", "hang_threshold_s must be a number of seconds >= 0.01"),
        ("DIAG_FLUSH_INTERVAL_S", "nan", "flush_interval_s must be a number of seconds"),
        ("DIAG_FINGERPRINT_EVERY", "1.5", "expected a whole number"),
        ("DIAG_PROMETHEUS_PORT", "99999", "prometheus_port must be a port number"),
        ("DIAG_TRACE_FORMAT", "3", "trace_format must be one of"),
        ("DIAG_DDP_BUCKETS", "hooks", "ddp_buckets must be one of"),
        ("DIAG_PARALLEL", "dp=8", "expected JSON"),
        ("DIAG_PARALLEL", "[8]", "parallel must map dimension names"),
        ("DIAG_MEMORY_DEEP_STEPS", "two", "expected START,COUNT"),
        ("DIAG_MEMORY_DEEP_STEPS", "1,2,3", "expected START,COUNT"),
        ("DIAG_MEMORY_DEEP_STEPS", "0,50", "memory_deep_steps must be"),
    ],
)
def test_a_malformed_variable_is_an_error_naming_it(variable, text, why):
    with pytest.raises(ValueError) as error:
        CaptureConfig.from_environment({variable: text})
    assert f"{variable}={text!r}" in str(error.value) and why in str(error.value)


def test_every_malformed_variable_is_named_in_one_error():
    with pytest.raises(ValueError) as error:
        CaptureConfig.from_environment({"DIAG_TELEMETRY": "maybe", "DIAG_CALIBRATE_EVERY": "often"})
    assert "DIAG_TELEMETRY" in str(error.value) and "DIAG_CALIBRATE_EVERY" in str(error.value)


def test_an_option_given_wins_over_its_variable_and_others_still_apply():
    environ = {"DIAG_HANG_THRESHOLD_S": "60", "DIAG_TELEMETRY": "0", "DIAG_WATCHDOG": "not read"}
    config = CaptureConfig.from_environment(environ, hang_threshold_s=30.0, watchdog=False)
    assert (config.hang_threshold_s, config.telemetry, config.watchdog) == (30.0, False, False)


def test_a_wrong_option_given_is_named_as_the_option_not_as_a_variable():
    with pytest.raises(ValueError) as error:
        CaptureConfig.from_environment({"DIAG_TELEMETRY": "0"}, flush_interval_s=0)
    assert "flush_interval_s must be" in str(error.value) and "DIAG_" not in str(error.value)


def test_empty_and_unrelated_variables_change_nothing():
    environ = {"DIAG_TELEMETRY": "", "DIAG_MEMORY": "  ", "DIAG_RUN_ID": "run-7", "TELEMETRY": "0"}
    assert CaptureConfig.from_environment(environ) == CaptureConfig()


@pytest.mark.parametrize(
    "variable, meant",
    [
        ("DIAG_HANG_THRESHOLD", "DIAG_HANG_THRESHOLD_S"),
        ("DIAG_MEMORY_DEEP", "DIAG_MEMORY_DEEP_STEPS"),
        ("diag_telemetry", "DIAG_TELEMETRY"),
        ("DIAG_WATCHDOG_TIMEOUT", "DIAG_WATCHDOG"),
    ],
)
def test_a_nearly_right_variable_is_one_warning_naming_the_option_it_missed(variable, meant):
    reset_for_tests()
    with pytest.warns(DiagWarning, match=f"{variable} is not an option's variable.*{meant}"):
        assert CaptureConfig.from_environment({variable: "60"}) == CaptureConfig()


def test_diags_other_variables_are_no_near_miss():
    environ = {"DIAG_RUN_ID": "r", "DIAG_DASHBOARD_TOKEN": "t", "DIAG_COMPLETE": "1", "DIAG_AS_INSTALLED": "1"}
    reset_for_tests()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagWarning)
        assert CaptureConfig.from_environment(environ) == CaptureConfig()


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("DIAG_HEARTBEAT_INTERVAL_S", "2.5")
    assert CaptureConfig.from_environment().heartbeat_interval_s == 2.5


def test_an_unknown_option_to_from_environment_is_a_type_error():
    with pytest.raises(TypeError, match=r"unknown options \['hang_threshold'\]"):
        CaptureConfig.from_environment({}, hang_threshold=60)


# -- through diag.init ------------------------------------------------------------------------------------------
def test_an_unknown_option_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"diag.init got unknown options \['flops_per_stpe', 'telemetri'\]"):
        diag.init(tmp_path, flops_per_stpe=1.0, telemetri=False)
    assert not diag.session().enabled and not (tmp_path / "rank00000").exists()


def test_an_unknown_option_beside_a_config_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="telemetri"):
        diag.init(tmp_path, config=CaptureConfig(), telemetri=False)


def test_a_config_that_is_not_a_capture_config_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="must be a CaptureConfig"):
        diag.init(tmp_path, config={"telemetry": False})


def test_init_takes_a_config_and_options_beside_it_replace_its_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_FLOPS_PER_STEP", "5e9")  # a config given is used as given: not read
    session = diag.init(tmp_path, config=CaptureConfig(**QUIET, memory=False, dtype="fp32"), dtype="bf16")
    try:
        assert session.enabled and session.config == CaptureConfig(**QUIET, memory=False, dtype="bf16")
        assert session.memory is None and session.telemetry is None and session.watchdog is None
    finally:
        diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    assert manifest.dtype == "bf16" and manifest.flops_per_step is None


def test_init_reads_the_environment_and_options_win(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_MEMORY", "0")
    monkeypatch.setenv("DIAG_DTYPE", "fp16")
    monkeypatch.setenv("DIAG_FLOPS_PER_STEP", "5e9")
    session = diag.init(tmp_path, dtype="bf16", **QUIET)
    try:
        assert session.memory is None and session.config.dtype == "bf16"
    finally:
        diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    assert manifest.dtype == "bf16" and manifest.flops_per_step == 5e9


def test_a_malformed_variable_stops_init_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_HANG_THRESHOLD_S", "soon")
    with pytest.raises(ValueError, match="DIAG_HANG_THRESHOLD_S='soon'"):
        diag.init(tmp_path, **QUIET)
    assert not diag.session().enabled and not (tmp_path / "rank00000").exists()


def test_the_framework_callbacks_pass_a_config_through(tmp_path):
    from diag.integrations._driver import StepDriver  # what DiagCallback and DiagTrainerCallback start sessions with

    driver = StepDriver(tmp_path, {"config": CaptureConfig(**QUIET, memory=False), "dtype": "bf16"})
    driver.start()
    try:
        assert driver.owns_session and driver.session.config == CaptureConfig(**QUIET, memory=False, dtype="bf16")
    finally:
        diag.finish()


@pytest.mark.parametrize("config_dtype, expected", [(None, "bfloat16"), ("fp32", "fp32")])
def test_diag_trainer_names_its_amp_dtype_unless_the_config_names_one(tmp_path, config_dtype, expected):
    import torch

    model = torch.nn.Linear(4, 1)
    options = {"config": CaptureConfig(**QUIET, dtype=config_dtype)}
    trainer = diag.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.nn.functional.mse_loss,
        tmp_path,
        amp_dtype=torch.bfloat16,
        session_options=options,
    )
    trainer.fit([(torch.randn(8, 4), torch.randn(8, 1))] * 2)
    assert diag.load(tmp_path).manifest(0).dtype == expected


# -- documentation ----------------------------------------------------------------------------------------------
def test_every_option_is_documented():
    assert all(f.metadata["doc"].strip() and f.metadata["env_form"].strip() for f in fields())


def test_capture_options_doc_is_generated_from_the_config():
    committed = (REPO / "docs" / "capture-options.md").read_text()
    assert committed == render_markdown(), "regenerate: python -m diag.capture.options_doc > docs/capture-options.md"


def test_help_of_diag_init_lists_every_option():
    text = diag.init.__doc__
    assert all(f"{f.name}: " in text and env_variable(f.name) in text for f in fields())


def test_the_options_doc_is_linked_from_the_readme():
    assert "docs/capture-options.md" in (REPO / "README.md").read_text()
