"""diag triage with NCCL's logs: the verdict's evidence says which transport the hung group's ranks use and what
NCCL warned. The hang is the bundled sample (a real 3-rank gloo job, rank 1 stuck in its data loader); its rank
directories get nccl.log files that are real processes' logs from public issues (tests/fixtures/nccl/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from tests.analysis.nccl_logs import SOURCES, process_lines

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "hang"


def test_hang_verdict_carries_the_groups_nccl_transport_and_warnings(tmp_path):
    run = tmp_path / "hang"
    shutil.copytree(SAMPLE, run)
    for rank, name in enumerate(["roce_2.19.3", "socket_2.19.3", "gdr_on"]):
        (run / f"rank{rank:05d}" / "nccl.log").write_text("\n".join(process_lines(*SOURCES[name])) + "\n")
    result = CliRunner().invoke(main, ["triage", str(run), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "missing_ranks" and verdict["collective"]["pg"] == "0"
    nccl = [line for line in verdict["evidence"] if line.startswith("NCCL")]
    assert nccl == [
        "NCCL: rank 0: NET/RoCE",
        "NCCL: rank 1: NET/Socket",
        "NCCL: rank 2: NET/IB, GPUDirect RDMA on",
        "NCCL WARN on rank 2: NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len "
        "5327, vendor err 81 (Send)",
    ]
    text = CliRunner().invoke(main, ["triage", str(run)]).stdout
    assert "NCCL: rank 1: NET/Socket" in text


def test_without_nccl_logs_the_verdict_is_unchanged(tmp_path):
    result = CliRunner().invoke(main, ["triage", str(SAMPLE), "--format", "json"])
    assert not [line for line in json.loads(result.stdout)["evidence"] if line.startswith("NCCL")]
