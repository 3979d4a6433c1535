"""Capture's own inputs and edges (issue 12 items 10 and 11): plainly wrong options are one clear error at
init, before training; any phase name round-trips through the trace; a forward that raised does not inflate
the next one; a full disk during a hang dump is one warning and leaves no temp file."""

import math
import os
import signal
import time
import warnings

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


class Flaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fail = False

    def forward(self, x):
        time.sleep(0.3)
        if self.fail:
            raise RuntimeError("bad batch")
        return x * 2


def test_a_forward_that_raised_does_not_inflate_the_next_forward(tmp_path):
    diag.init(tmp_path, telemetry=False, watchdog=False)
    model = Flaky()
    diag.instrument(model)
    with diag.step():
        model.fail = True
        with pytest.raises(RuntimeError, match="bad batch"):  # the user's exception, unchanged
            model(torch.ones(2))
    time.sleep(0.5)  # between the steps: no forward is running
    with diag.step():
        model.fail = False
        model(torch.ones(2))
    diag.finish()
    forward_us = diag.load(tmp_path).steps["forward_us"].tolist()
    assert forward_us[1] < 0.6e6  # was ~1.1 s: the failed forward's start, the pause and this forward
    assert forward_us[0] >= 0.29e6  # the failed forward's time belongs to its own step


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_disk_during_a_hang_dump_is_one_warning_and_leaves_no_temp_file(tmp_path, monkeypatch):
    import torch.distributed as dist

    from diag.trace import writer

    rank_dir = tmp_path / "rank00000"
    write_new_file = writer._write_new_file

    def on_dev_full(path, data, truncate=False):
        """The Flight Recorder dump's temp file is created, then written on /dev/full (ENOSPC): only that file
        meets a full disk (a link planted at its name would be refused, not written through)."""
        write_new_file(path, b"", truncate)
        if "fr_dump" in path.name:
            with open("/dev/full", "wb") as full:
                full.write(data)
                full.flush()
        else:
            write_new_file(path, data, True)

    monkeypatch.setattr(writer, "_write_new_file", on_dev_full)
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            session = diag.init(tmp_path, telemetry=False, clock_sync=False)
            dist.all_reduce(torch.ones(4))
            os.kill(os.getpid(), signal.SIGUSR1)  # dump now
            time.sleep(0.5)
            diag.finish()
    finally:
        dist.destroy_process_group()
        del os.environ["TORCH_FR_BUFFER_SIZE"]
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert messages == [], messages  # the dump is written without it; the reason is in the dump
    assert not list(rank_dir.glob("*.tmp")) and not (rank_dir / "fr_dump.pkl").exists()
    dumps = sorted(rank_dir.glob("hang_dump_*.json"))
    assert dumps and "No space left" in dumps[0].read_text()
    assert session.writer.enabled  # the traces themselves still have room
