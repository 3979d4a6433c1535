"""Capture's own inputs and edges (issue 12 items 10 and 11): plainly wrong options are one clear error at
init, before training; any phase name round-trips through the trace; a forward that raised does not inflate
the next one; a full disk during a hang dump is one warning and leaves no temp file."""

import math

import pytest
import torch

import diag
from diag._warn import DiagWarning


@pytest.mark.parametrize(
    "options, named",
    [
        ({"flush_interval_s": 0}, "flush_interval_s"),
        ({"flush_interval_s": -1}, "flush_interval_s"),
        ({"flush_interval_s": math.nan}, "flush_interval_s"),
        ({"heartbeat_interval_s": "5"}, "heartbeat_interval_s"),
        ({"telemetry_interval_s": math.inf}, "telemetry_interval_s"),
        ({"hang_threshold_s": 0}, "hang_threshold_s"),
        ({"peak_tflops": 0}, "peak_tflops"),
        ({"flops_per_step": -5.0}, "flops_per_step"),
        ({"watchdog": "yes"}, "watchdog"),
        ({"ddp_buckets": "hooks"}, "ddp_buckets"),
        ({"ddp_buckets": 1}, "ddp_buckets"),
        ({"parallel": {"tp": 0}}, "parallel"),
        ({"prometheus_port": 70000}, "prometheus_port"),
        ({"dtype": torch.bfloat16}, "dtype"),
    ],
)
def test_a_plainly_wrong_option_is_a_clear_error_at_init(tmp_path, options, named):
    with pytest.raises(ValueError, match=named):
        diag.init(tmp_path, **options)
    assert not diag.session().enabled
    assert not (tmp_path / "rank00000").exists()  # nothing started


def test_every_wrong_option_is_named_in_one_error(tmp_path):
    with pytest.raises(ValueError) as error:
        diag.init(tmp_path, flush_interval_s=0, memory=1, peak_tflops=-1)
    assert all(name in str(error.value) for name in ("flush_interval_s", "memory", "peak_tflops"))


def test_a_misspelt_step_at_is_a_clear_error_and_one_without_an_engine_a_warning(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="step_at"):
        diag.instrument(model, step_at="boundary")  # would silently give one step per micro-batch
    diag.init(tmp_path, telemetry=False, watchdog=False)
    try:
        with pytest.warns(DiagWarning, match="applies to a DeepSpeed engine"):
            diag.instrument(model, step_at="accumulation_boundary")
    finally:
        diag.finish()


def test_valid_options_start_capture(tmp_path):
    session = diag.init(
        tmp_path, flush_interval_s=0.01, telemetry=False, parallel={"dp": 1}, peak_tflops=1.5, prometheus_port=None
    )
    assert session.enabled
    diag.finish()


@pytest.mark.parametrize("trace_format", [1, 2])
@pytest.mark.parametrize("name", ["a,b", 'say "hi"', "two\nlines", "cr\rhere", "ünïcode, ok", ',,\n",'])
def test_any_phase_name_round_trips_and_forges_no_row(tmp_path, name, trace_format):
    diag.init(tmp_path, telemetry=False, watchdog=False, trace_format=trace_format)
    for _ in range(3):
        with diag.step(), diag.phase(name):
            pass
    diag.finish()
    phases = diag.load(tmp_path).phases
    assert len(phases) == 3
    # CSV writes line breaks as visible escapes (one row a line); Arrow keeps every name exactly
    expected = name.replace("\n", "\\n").replace("\r", "\\r") if trace_format == 1 else name
    assert set(phases["name"].astype(str)) == {expected}
    assert list(phases["step"]) == [0, 1, 2]
