"""NCCL's view of a run (diag/analysis/nccl.py) and its findings, on ranks whose nccl.log are real processes' logs
from tests/fixtures/nccl/ (each fixture names its public source): a rank on Socket among RoCE ranks, mixed
versions, SHM where the others use P2P, GPUDirect RDMA off, fewer channels; then the same through ``diag analyze``
on a trace directory with nccl.log files."""

from __future__ import annotations

from diag.analysis.findings import FindingContext
from diag.analysis.nccl import analyze_nccl, nccl_findings
from diag.analysis.report import analyze
from diag.trace.loader import load
from diag.trace.manifest import Manifest
from diag.trace.nccl_log import parse_lines
from tests.analysis.helpers import make_trace, run_cli
from tests.analysis.nccl_logs import SOURCES, process_lines

CTX = FindingContext(step_s=0.1, steps=10, times=None, stragglers=None)


def logs_of(*names: str):
    return {rank: parse_lines(process_lines(*SOURCES[name])) for rank, name in enumerate(names)}


def manifests(hosts: list[str], **extra) -> dict[int, Manifest]:
    return {r: Manifest.from_json({"rank": r, "host": h, **extra.get(str(r), {})}, r) for r, h in enumerate(hosts)}


def kinds(findings) -> dict:
    return {f.kind: f for f in findings}


def test_rank_on_socket_among_roce_ranks_and_mixed_versions():
    logs = logs_of("roce_2.18.5", "roce_nover", "roce_2.19.3", "socket_2.19.3")
    report = analyze_nccl(logs, manifests(["a", "b", "c", "d"], **{"1": {"nccl_version": "2.18.5"}}))
    assert [v.net_kind for v in report.ranks] == ["RoCE", "RoCE", "RoCE", "Socket"]
    assert report.versions == {"2.18.5": [0, 1], "2.19.3": [2, 3]}  # rank 1's from its manifest (torch's NCCL)
    found = kinds(nccl_findings(report, CTX))
    socket = found["nccl_transport"]
    assert (socket.severity, socket.ranks, socket.hosts) == ("high", [3], ["d"])
    assert "fell back to TCP sockets" in socket.title and "RoCE" in socket.title
    assert any("4-5x less bus bandwidth" in line for line in socket.evidence)
    version = found["nccl_version"]
    assert version.severity == "high" and version.ranks == [2, 3]  # a tie: the later version is the odd one
    assert "2.18.5" in version.title and "2.19.3" in version.title
    assert found["nccl_settings"].evidence[0].startswith("NCCL_IB_HCA: mlx5_4 on ranks 0, 1")


def test_shm_instead_of_p2p_on_one_host():
    report = analyze_nccl(logs_of("p2p_a", "p2p_b", "shm"), manifests(["n1", "n1", "n2"]))
    (finding,) = [f for f in nccl_findings(report, CTX) if f.kind == "nccl_p2p"]
    assert finding.ranks == [2] and finding.hosts == ["n2"] and "SHM" in finding.title


def test_gpudirect_rdma_off_where_others_use_it():
    report = analyze_nccl(logs_of("gdr_on", "gdr_off"), manifests(["kolyoz2", "swat1-04"]))
    assert [v.gdr for v in report.ranks] == [True, False]
    (finding,) = [f for f in nccl_findings(report, CTX) if f.kind == "nccl_gdr"]
    assert finding.ranks == [1] and finding.hosts == ["swat1-04"]


def test_fewer_channels_than_peers():
    report = analyze_nccl(logs_of("p2p_b", "two_channels", "p2p_b"), manifests(["x", "y", "z"]))
    assert [v.channels for v in report.ranks] == [16, 2, 16]
    (finding,) = [f for f in nccl_findings(report, CTX) if f.kind == "nccl_channels"]
    assert finding.ranks == [1] and "(2) than their peers (16)" in finding.title


def test_alike_ranks_give_no_finding():
    report = analyze_nccl(logs_of("roce_2.19.3", "roce_2.19.3"), manifests(["a", "b"]))
    assert nccl_findings(report, CTX) == []


def test_no_log_no_report():
    assert analyze_nccl({}, manifests(["a"])) is None


def _comm_lines(pid: int, comms: list[tuple[str, int, int, str, str]]) -> list[str]:
    """NCCL 2.21's Init START line and a connection line per communicator: (ptr, rank, nranks, commId, via)."""
    out = []
    for tid, (ptr, rank, nranks, comm_id, via) in enumerate(comms, start=100):
        start = f"comm {ptr} rank {rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId 1000 commId {comm_id} - Init START"
        out.append(f"h:{pid}:{tid} [0] NCCL INFO ncclCommInitRank {start}")
        out.append(f"h:{pid}:{tid} [0] NCCL INFO Channel 00/0 : {rank}[0] -> {(rank + 1) % nranks}[0] via {via}")
        out.append(
            f"h:{pid}:{tid} [0] NCCL INFO 4 coll channels, 0 collnet channels, 0 nvls channels, 4 p2p channels, 1 p2p channels per peer"
        )
    return out


def test_process_groups_matched_to_communicators_by_comm_id():
    """Groups [0, 1] and [0, 2] have the same size and rank 0 at the same position: their commIds tell them apart."""
    logs = {
        0: parse_lines(_comm_lines(10, [("0xa", 0, 2, "0x111", "P2P/CUMEM"), ("0xb", 0, 2, "0x222", "NET/Socket/0")])),
        1: parse_lines(_comm_lines(11, [("0xc", 1, 2, "0x111", "P2P/CUMEM")])),
        2: parse_lines(_comm_lines(12, [("0xd", 1, 2, "0x222", "NET/Socket/0")])),
    }
    groups = {"1": {"ranks": [0, 1], "size": 2}, "2": {"ranks": [0, 2], "size": 2}}
    report = analyze_nccl(logs, manifests(["a", "a", "b"], **{str(r): {"process_groups": groups} for r in range(3)}))
    by_pg = {g.pg: g for g in report.groups}
    assert (by_pg["1"].comm_id, by_pg["1"].transports, by_pg["1"].channels) == ("0x111", ["P2P"], 4)
    assert (by_pg["2"].comm_id, by_pg["2"].transports, by_pg["2"].net_kinds) == ("0x222", ["NET/Socket"], ["Socket"])


def test_through_diag_analyze_with_nccl_logs_in_the_trace(tmp_path):
    make_trace(tmp_path, ranks=4, steps=8)
    for rank, name in enumerate(["roce_2.19.3", "roce_2.19.3", "socket_2.19.3", "roce_2.19.3"]):
        (tmp_path / f"rank{rank:05d}" / "nccl.log").write_text("\n".join(process_lines(*SOURCES[name])) + "\n")
    report = analyze(load(tmp_path))
    assert [v.net_kind for v in report.nccl.ranks] == ["RoCE", "RoCE", "Socket", "RoCE"]
    (finding,) = [f for f in report.findings if f.kind == "nccl_transport"]
    assert finding.ranks == [2] and finding.hosts == ["node0000"]
    assert report.to_dict()["nccl"]["ranks"][2]["net_kind"] == "Socket"
    text = run_cli(tmp_path, "--no-cache").output
    nccl = text.split("\nNCCL\n====", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "NCCL versions: 2.19.3 (4 ranks); 4 ranks with an nccl.log" in nccl
    first_row = nccl[nccl.index(next(line for line in nccl if line.startswith("----"))) + 1]
    assert first_row.split()[:4] == ["2", "node0000", "2.19.3", "Socket"]  # the rank unlike the others first
