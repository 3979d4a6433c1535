"""nccl.log in a rank directory reaches ``Trace.nccl_logs``, bounded in size, through the cache, and never stops a
load when damaged or planted as something that is not a file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from diag.trace import loader
from diag.trace.cache import load_cached
from diag.trace.loader import load
from tests.analysis.helpers import make_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
RANK1_LINES = [  # rank 4's lines of tests/fixtures/nccl/ibext_gdr_2.21.5_nccl-tests-252.log (NCCL 2.21.5)
    line
    for line in (FIXTURES / "ibext_gdr_2.21.5_nccl-tests-252.log").read_text().splitlines()
    if line.startswith("kolyoz2:25146:")
]


def small_trace(path: Path) -> Path:
    make_trace(path, ranks=4, steps=6)
    (path / "rank00001" / "nccl.log").write_text("\n".join(RANK1_LINES) + "\n")
    return path


def test_nccl_log_is_parsed_per_rank(tmp_path):
    trace = load(small_trace(tmp_path))
    assert set(trace.nccl_logs) == {1}
    log = trace.nccl_logs[1]
    assert (log.host, log.pid) == ("kolyoz2", 25146) and log.gdr() is True
    assert log.comms[0].rank == 4 and log.warnings_total == 1
    assert not [s for s in trace.skipped if "nccl.log" in s.path]


def test_damaged_lines_are_counted_in_skipped(tmp_path):
    small_trace(tmp_path)
    with open(tmp_path / "rank00001" / "nccl.log", "a") as handle:
        handle.write("kolyoz2:25146:25827 [0] NCCL INFO Channel 01/0 : 3[3] -> kolyoz2:25146:25827 [0] NCCL INFO x\n")
        handle.write("kolyoz2:25146:25827 [0] NCCL INFO Chan")  # cut mid-line
    trace = load(tmp_path)
    (note,) = [s for s in trace.skipped if s.path.endswith("nccl.log")]
    assert note.lines == 2 and "not understood" in note.reason
    assert trace.nccl_logs[1].comms[0].rank == 4


def test_a_huge_log_is_read_up_to_the_limit(tmp_path, monkeypatch):
    small_trace(tmp_path)
    monkeypatch.setattr(loader, "MAX_NCCL_LOG_BYTES", 4096)
    with open(tmp_path / "rank00001" / "nccl.log", "a") as handle:
        for _ in range(2000):
            handle.write("kolyoz2:25146:25827 [0] NCCL INFO + PCI[24.0] - GPU/A1000 (0)\n")
    trace = load(tmp_path)
    assert trace.nccl_logs[1].comms[0].rank == 4  # what diag needs comes first
    assert any("only the first 4096 read" in s.reason for s in trace.skipped)


def test_a_fifo_under_the_name_neither_hangs_nor_fails_the_load(tmp_path):
    make_trace(tmp_path, ranks=2, steps=4)
    os.mkfifo(tmp_path / "rank00000" / "nccl.log")
    trace = load(tmp_path)
    assert trace.nccl_logs == {} and any("nccl.log" in s.path and "unreadable" in s.reason for s in trace.skipped)


def test_parsed_logs_come_back_from_the_cache(tmp_path):
    small_trace(tmp_path / "run")
    first, how = load_cached(tmp_path / "run")
    second, how_again = load_cached(tmp_path / "run")
    assert (how, how_again) == ("loaded+cached", "cache")
    assert second.nccl_logs == first.nccl_logs and second.nccl_logs[1].gdr() is True


def test_a_run_without_nccl_log_has_none(tmp_path):
    shutil.copytree(Path(__file__).resolve().parents[3] / "sample_traces" / "straggler", tmp_path / "s")
    assert load(tmp_path / "s").nccl_logs == {}
