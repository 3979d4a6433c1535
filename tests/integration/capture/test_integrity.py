"""Capture never loses data silently, never corrupts its own trace and never writes through a planted link
(issue 30): a disk that fills or a directory made unwritable mid-run stops capture with one warning and says so
in the manifest, the heartbeat, the report and triage; new process groups after ``destroy_process_group`` are
followed; ``diag.step`` repeated per micro-batch is warned about and not read as a second run; a forked child
never writes the parent's rows; a symbolic link planted in the trace directory is never written through."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import diag
from diag._warn import DiagWarning
from diag.analysis.report import analyze
from diag.launch import run_ranks
from diag.triage.analysis import triage
from diag.triage.sources import read_input
from tests.conftest import JOBS

STEPS_BEFORE = STEPS_AFTER = 15


def _losses(steps: range) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(len(steps), 16, 32, generator=torch.Generator().manual_seed(1))
    losses = []
    for i, step in enumerate(steps):
        with diag.step(step, samples=16):
            loss = model(data[i]).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _run_with_fault(trace_dir: Path, fault, trace_format: int) -> tuple[list[float], list[str]]:
    """Train STEPS_BEFORE steps, let them reach the disk, plant ``fault``, train STEPS_AFTER more, finish:
    (the losses, diag's warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        diag.init(
            trace_dir, telemetry=False, flush_interval_s=0.05, heartbeat_interval_s=0.1, trace_format=trace_format
        )
        losses = _losses(range(STEPS_BEFORE))
        time.sleep(0.5)  # those steps are on the disk
        fault()
        losses += _losses(range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
        time.sleep(0.5)  # the writer and the watchdog meet the fault
        diag.finish()
    return losses, [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]


def _reference_losses() -> list[float]:
    return _losses(range(STEPS_BEFORE)) + _losses(range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB tmpfs: it fills as a disk does (ENOSPC), unlike a directory made read-only as root."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.decode().strip()}): a real full disk needs one")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> None:
    fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 65536)
    finally:
        os.close(fd)


def _assert_stop_is_said(trace_dir: Path, reason: str, messages: list[str]) -> None:
    """One warning; the manifest, the heartbeat, the report and triage all say that capture stopped."""
    assert len(messages) == 1 and "capture stopped" in messages[0], messages
    rank_dir = trace_dir / "rank00000"
    manifest = json.loads((rank_dir / "manifest.json").read_text())
    stopped = manifest["capture_stopped"]
    assert stopped["reason"] == reason and stopped["step"] >= STEPS_BEFORE
    assert json.loads((rank_dir / "heartbeat.json").read_text())["state"] == "capture_stopped"
    trace = diag.load(trace_dir)
    recorded = trace.steps["step"]
    assert recorded.min() == 0 and STEPS_BEFORE - 1 <= recorded.max() < stopped["step"]
    notes = analyze(trace).run.notes
    expected = (
        f"capture stopped at step {stopped['step']} ({reason}) on rank 0: the report covers steps "
        f"0-{recorded.max()} there"
    )
    assert any(note.startswith(expected) for note in notes), notes
    verdict = triage(read_input(trace_dir))
    assert verdict.verdict == "capture_stopped" and verdict.culprit_ranks == [0]
    assert f"capture stopped at step {stopped['step']} ({reason})" in verdict.evidence[0]


@pytest.mark.parametrize("trace_format", [1, 2])
def test_disk_filling_mid_run_stops_capture_and_every_reader_says_where(small_disk, trace_format):
    expected = _reference_losses()
    trace_dir = small_disk / "trace"
    losses, messages = _run_with_fault(trace_dir, lambda: _fill(small_disk), trace_format)
    assert losses == expected
    assert "No space left" in messages[0]
    _assert_stop_is_said(trace_dir, "disk full", messages)


@pytest.mark.parametrize("trace_format", [1, 2])
def test_directory_made_unwritable_mid_run_stops_capture_and_says_where(tmp_path, trace_format):
    """``chattr +i``: as root, chmod does not stop writes; an immutable directory refuses new files (the
    manifest and heartbeat are then rewritten in place)."""
    rank_dir = tmp_path / "trace" / "rank00000"

    def freeze():
        result = subprocess.run(["chattr", "+i", str(rank_dir)], capture_output=True)
        if result.returncode:
            pytest.skip(f"chattr +i is not possible here ({result.stderr.decode().strip()})")

    expected = _reference_losses()
    try:
        losses, messages = _run_with_fault(tmp_path / "trace", freeze, trace_format)
    finally:
        subprocess.run(["chattr", "-i", str(rank_dir)], check=False)
    assert losses == expected
    _assert_stop_is_said(tmp_path / "trace", "trace directory not writable", messages)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["seen", "unseen"])
def test_collectives_of_new_process_groups_recorded_after_destroy_process_group(tmp_path, how):
    """A real 2-rank gloo job: 16 steps, destroy_process_group(), a new group, 14 steps. Every step keeps its
    explicit all_reduce and its DDP bucket (from Flight Recorder), and the new group's collectives, numbered
    from 1 again by c10d, never collide with the old group's (pg, seq). "unseen": the job calls a
    destroy_process_group bound before diag.init; the new group is recognised when it first appears."""
    results = run_ranks(
        [str(JOBS / "regroup_job.py"), str(tmp_path), str(_free_port()), *(["unseen"] if how == "unseen" else [])],
        2,
        env={"TORCH_FR_BUFFER_SIZE": "4000"},
        timeout_s=240,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    trace = diag.load(tmp_path)
    coll = trace.collectives
    for rank in (0, 1):
        mine = coll[coll["rank"] == rank]
        for source in ("py", "ddp"):
            steps = set(mine.loc[mine["source"] == source, "step"])
            assert steps == set(range(30)), (rank, source, sorted(set(range(30)) - steps))
        assert not mine.duplicated(["pg", "seq"]).any()
        assert set(mine.loc[mine["step"] >= 16, "pg"]) == {"0@1"}
        assert set(trace.manifests[rank].process_groups) == {"0", "0@1"}
    assert not trace.skipped


def test_step_repeated_per_micro_batch_warns_once_and_keeps_every_step(tmp_path):
    result = subprocess.run(
        [sys.executable, str(JOBS / "micro_batch_job.py"), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "diag.step called with step" in line]
    assert len(said) == 1 and "step 0 again" in said[0] and "once per optimizer step" in said[0]
    trace = diag.load(tmp_path)
    assert len(trace.steps) == 40 and trace.steps["step"].nunique() == 10
    assert not any("start again" in s.reason for s in trace.skipped)
    # the same job run again into the directory is a second run, and is still cut
    subprocess.run([sys.executable, str(JOBS / "micro_batch_job.py"), str(tmp_path)], check=True, timeout=120)
    again = diag.load(tmp_path)
    assert len(again.steps) == 40 and any("start again" in s.reason for s in again.skipped)


def test_child_forked_inside_a_step_leaves_the_parents_trace_alone(tmp_path):
    result = subprocess.run(
        [sys.executable, str(JOBS / "fork_job.py"), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trace = diag.load(tmp_path)
    assert list(trace.steps["step"]) == list(range(30))
    assert not any("start again" in s.reason for s in trace.skipped)
    assert trace.events.empty or not trace.events["kind"].isin(["step_error"]).any()
    assert trace.manifests[0].finished


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    victim = tmp_path / "victim"
    victim.mkdir()
    files = {"precious.txt": b"the victim's own file\n"}
    for name, data in files.items():
        (victim / name).write_bytes(data)
    return victim, files


def _assert_untouched(victim: Path, files: dict[str, bytes]) -> None:
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == files


@pytest.mark.parametrize("trace_format", [1, 2])
def test_symlinked_rank_directory_is_refused_with_one_warning(tmp_path, trace_format):
    victim, files = _victim(tmp_path)
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "rank00000").symlink_to(victim, target_is_directory=True)
    expected = _reference_losses()
    losses, messages = _run_with_fault(tmp_path / "trace", lambda: None, trace_format)
    assert losses == expected
    assert len(messages) == 1 and "symbolic link" in messages[0] and "capture is off" in messages[0]
    _assert_untouched(victim, files)


def test_links_planted_at_file_names_are_never_written_through(tmp_path):
    """Schema 1's tables are appended to by name: a link planted there stops capture (one warning) instead of
    appending into its target; manifest and heartbeat replace a planted link, never write into its target."""
    victim, files = _victim(tmp_path)
    rank_dir = tmp_path / "trace" / "rank00000"
    rank_dir.mkdir(parents=True)
    for name in ("steps.csv", "manifest.json", "heartbeat.json"):
        (rank_dir / name).symlink_to(victim / "precious.txt")
    losses, messages = _run_with_fault(tmp_path / "trace", lambda: None, trace_format=1)
    assert losses == _reference_losses()
    assert len(messages) == 1 and "symbolic link" in messages[0]
    _assert_untouched(victim, files)


FAULTHANDLER_JOB = """
import sys
import diag
diag.init(sys.argv[1], telemetry=False)
with diag.step():
    pass
diag.finish()
"""


def test_fatal_stacks_file_is_never_written_through_a_link_and_removed_when_empty(tmp_path):
    """A job of its own (pytest enables faulthandler itself, and diag then leaves it alone)."""
    victim, files = _victim(tmp_path)
    planted = tmp_path / "planted" / "rank00000"
    planted.mkdir(parents=True)
    (planted / "fatal_stacks.txt").symlink_to(victim / "precious.txt")
    for trace_dir in (tmp_path / "plain", tmp_path / "planted"):
        result = subprocess.run(
            [sys.executable, "-c", FAULTHANDLER_JOB, str(trace_dir)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-3000:]
        said = [line for line in result.stderr.splitlines() if "DiagWarning" in line]
        if trace_dir.name == "plain":
            assert said == [] and not (trace_dir / "rank00000" / "fatal_stacks.txt").exists()
        else:
            assert len(said) == 1 and "no stacks on fatal signals" in said[0], said
    _assert_untouched(victim, files)
