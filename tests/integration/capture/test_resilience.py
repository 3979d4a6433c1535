"""Capture never hurts the job: every failure is one warning, the loop goes on, and its results are unchanged."""

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

import diag
from diag._warn import DiagWarning
from tests.capture.training import reference_losses, train
from tests.conftest import JOBS


def train_under_capture(trace_dir, settle_s: float = 0.0, before_training=None, **options):
    """Run ``train()`` inside a diag session; returns (session, losses, diag's warning messages).
    ``settle_s`` gives the writer thread time to meet a planted fault before finish."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = diag.init(trace_dir, telemetry=False, **options)
        if before_training is not None:
            before_training(session)
        losses = train()
        time.sleep(settle_s)
        diag.finish()
    return session, losses, [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]


def test_unwritable_trace_dir_warns_once_and_training_is_unchanged(tmp_path):
    expected = reference_losses()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    _, losses, messages = train_under_capture(blocker / "traces")
    assert losses == expected
    assert len(messages) == 1 and "cannot write traces" in messages[0]


def _segments_on_dev_full(monkeypatch) -> None:
    """Schema version 2: the writer's segments opened on /dev/full (a segment's name is chosen as it is created,
    exclusively, so no link can be planted under it beforehand)."""
    import pyarrow as pa

    from diag.trace.columnar import StreamSegmentWriter

    def on_dev_full(_path):
        return pa.BufferedOutputStream(pa.OSFile("/dev/full", "a"), buffer_size=1 << 20)

    monkeypatch.setattr(StreamSegmentWriter, "_open_sink", staticmethod(on_dev_full))


def test_full_disk_warns_once_and_training_is_unchanged(tmp_path, monkeypatch):
    """Segments on /dev/full (every write ENOSPC). A real full disk, in both trace formats, is a small tmpfs
    in tests/integration/capture/test_integrity.py (a link to /dev/full planted at a CSV table's name is now refused)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    expected = reference_losses()
    _segments_on_dev_full(monkeypatch)
    session, losses, messages = train_under_capture(tmp_path, settle_s=0.2, flush_interval_s=0.05, trace_format=2)
    assert losses == expected
    assert len(messages) == 1 and "No space left" in messages[0]
    assert not session.writer.enabled


@pytest.mark.parametrize("trace_format", [1, 2])
def test_writer_thread_failure_warns_once_and_training_is_unchanged(tmp_path, monkeypatch, trace_format):
    expected = reference_losses()

    def broken_format(*_args):
        raise RuntimeError("formatter bug")

    monkeypatch.setattr("diag.trace.writer.format_rows", broken_format)
    monkeypatch.setattr("diag.trace.columnar.batch_from_rows", broken_format)
    session, losses, messages = train_under_capture(
        tmp_path, settle_s=0.3, flush_interval_s=0.05, trace_format=trace_format
    )
    assert losses == expected
    assert len(messages) == 1 and "formatter bug" in messages[0]
    assert not session.writer.enabled


def test_exception_inside_hooks_warns_and_training_is_unchanged(tmp_path, monkeypatch):
    expected = reference_losses()

    def broken(*args):
        raise ValueError("hook bug")

    def break_hooks(session):
        monkeypatch.setattr(session, "add_phase_time", broken)

    _, losses, messages = train_under_capture(tmp_path, before_training=break_hooks)
    assert losses == expected
    # one warning per failing hook, not one per call: forward, backward and optimizer
    assert len(messages) == 3 and all("hook bug" in m for m in messages)
    assert len(diag.load(tmp_path).steps) == 4  # steps are still recorded


@pytest.mark.parametrize("trace_format", [1, 2])
def test_sigkill_loses_at_most_about_a_second(tmp_path, trace_format):
    flush_interval_s = 0.5
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "kill_job.py"), str(tmp_path), str(flush_interval_s), str(trace_format)],
        stdout=subprocess.PIPE,
        text=True,
    )
    printed = []
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        printed.append(line.split())
        if int(printed[-1][0]) >= 60:
            break
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.time()
    proc.wait()
    # the job may have run ahead of this loop (a loaded machine): the steps it printed that were not read yet
    printed += [line.split() for line in proc.stdout.read().splitlines()]
    written = "steps.csv" if trace_format == 1 else "steps.000001.arrows"  # killed: never compacted into Parquet
    assert sorted(p.name for p in (tmp_path / "rank00000").glob("steps*")) == [written]
    trace = diag.load(tmp_path)
    assert trace.skipped == []  # a row or record batch cut by the kill is one still being written, not damage
    last_recorded = int(trace.steps["step"].max())
    last_printed = int(printed[-1][0])
    assert trace.steps["step"].tolist() == list(range(last_recorded + 1))  # nothing torn or out of order
    lost_s = killed_at - float(printed[last_recorded][1])
    assert last_recorded <= last_printed and lost_s <= 1.0 + 0.2
