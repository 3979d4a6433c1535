"""Capture's own inputs and edges (issue 12 items 10 and 11): plainly wrong options are one clear error at
init, before training; any phase name round-trips through the trace; a forward that raised does not inflate
the next one; a full disk during a hang dump is one warning and leaves no temp file."""

import os
import signal
import time
import warnings

import pytest
import torch

import diag
from diag._warn import DiagWarning


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
