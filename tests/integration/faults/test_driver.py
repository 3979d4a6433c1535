"""The fault suite's driver ends a job as a launcher would: a failed job once its ranks have waited past the
timeout, never a slow one, whose ranks wait in collectives past the hang threshold and still finish."""

import os
import subprocess
import sys
import time

import pytest

from diag.testing import faults

JOB_S = 2.0  # how long each stand-in rank runs: past the driver's launcher rule in this test


def _rank_that_runs(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _driven(kind: str, tmp_path, monkeypatch) -> list[int]:
    """The exit codes of two stand-in ranks driven for a ``kind`` scenario whose ranks have written a stall dump,
    with the launcher's wait after the first stall shortened to 0.2 s."""
    monkeypatch.setattr(faults, "PG_TIMEOUT_S", 0.2 - 8)
    (tmp_path / "rank00000").mkdir()
    scenario = faults.Scenario("propagate", "matmul", 2, kind, "data", "1x", rank=1, step=3)
    dump = tmp_path / "rank00000" / "hang_dump_001.json"
    dump.write_text("{}")
    now = time.time() + 60  # written during the drive: a dump older than the attempt is an earlier one's
    os.utime(dump, (now, now))
    procs = [_rank_that_runs(JOB_S) for _ in range(2)]
    try:
        assert faults._drive(scenario, procs, tmp_path, acting=True) is False
        return [proc.wait(timeout=30) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()


@pytest.mark.parametrize("kind", ["straggler", "intermittent", "healthy", "memory"])
def test_a_slow_job_with_stall_dumps_runs_to_its_end(kind, tmp_path, monkeypatch):
    assert _driven(kind, tmp_path, monkeypatch) == [0, 0]


def test_a_hung_job_is_ended_like_a_launcher_after_the_timeout(tmp_path, monkeypatch):
    assert _driven("hang", tmp_path, monkeypatch) == [-15, -15]
