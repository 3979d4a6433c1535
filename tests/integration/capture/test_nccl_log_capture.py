"""NCCL's log captured per rank: the three variables set only when the user set none and NCCL has not started,
the status in the manifest, and (on a GPU) a real nccl.log that the loader parses."""

from __future__ import annotations

import os

import pytest

from diag.launch import run_ranks
from diag.trace.loader import load
from tests.conftest import JOBS, requires_gpu


@pytest.mark.gpu
@requires_gpu
def test_real_nccl_log_on_one_gpu_is_captured_and_parsed(tmp_path, monkeypatch):
    # the job inherits this environment: with NCCL_DEBUG* set by the machine (the lent GPU machines set
    # NCCL_DEBUG), diag would rightly leave NCCL's log alone, so the job runs without them
    for name in [name for name in os.environ if name.startswith("NCCL_DEBUG")]:
        monkeypatch.delenv(name)
    results = run_ranks([str(JOBS / "nccl_log_job.py"), str(tmp_path)], 1, timeout_s=300)
    assert results[0].returncode == 0, results[0].stderr[-4000:]
    trace = load(tmp_path)
    assert trace.manifest(0).capture["nccl_log"].startswith("on:")
    log = trace.nccl_logs[0]
    assert log.version == trace.manifest(0).nccl_version
    assert log.cuda_driver and log.lines_used > 0 and log.lines_skipped == 0
    assert any(comm.nranks == 1 and comm.rank == 0 for comm in log.comms)
