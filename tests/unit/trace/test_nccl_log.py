"""The NCCL log parser on real NCCL_DEBUG=INFO lines from public issues (tests/fixtures/nccl/, each file names its
source and NCCL version): versions 2.18.3 to 2.25.1, InfiniBand, RoCE, Socket, SHM, P2P, NVLS, GPUDirect RDMA;
and on damaged input made from those lines (run together, cut short, garbage), which is counted, never fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.trace.nccl_log import NcclLog, parse_lines, parse_text, split_processes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"


def published(name: str) -> str:
    """The log lines of a fixture as published (our ``## `` header and gap notes dropped)."""
    lines = (FIXTURES / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("## ")) + "\n"


def processes(name: str) -> dict[tuple[str, int | None], NcclLog]:
    return {key: parse_lines(lines) for key, lines in split_processes(published(name)).items()}


def test_every_fixture_names_its_source_and_nccl_version():
    for path in FIXTURES.glob("*.log"):
        header = [line for line in path.read_text().splitlines() if line.startswith("## ")]
        assert any(line.startswith("## source: https://github.com/") for line in header), path.name
        assert any(line.startswith("## NCCL version:") for line in header), path.name
        assert path.name in (FIXTURES / "README.md").read_text()


def test_socket_transport_when_no_infiniband_device_nccl_2_19():
    (log,) = processes("socket_2.19.3_nccl-1267.log").values()
    assert (log.host, log.pid) == ("instance-8g-96c-4", 101707)
    assert (log.version, log.cuda_build, log.cuda_driver) == ("2.19.3", "12.3", 12000)
    assert log.version_tuple == (2, 19, 3)
    assert log.ib_none and log.network == "Socket" and log.net_kind() == "Socket"
    assert log.socket_devices == ["ens7:10.128.0.33"]
    (comm,) = log.comms
    assert (comm.ptr, comm.rank, comm.nranks, comm.comm_id) == ("0x558ef922a470", 0, 1, "0x7ef9513a104d9d97")
    assert comm.ring_channels == 32 and comm.rings[2] == [0]
    # the launcher's line and the line the excerpt cut short are counted, not fatal
    assert log.lines_skipped == 1 and log.skipped_examples == ["instance-8g-96c-4:101707:101889"]


def test_roce_ports_and_nccl_ib_hca_setting_nccl_2_18_5():
    logs = processes("roce_2.18.5_nccl-1052.log")
    node2, node4 = logs[("node2", 14159)], logs[("node4", 565139)]
    assert node2.version == "2.18.5" and node2.cuda_build == "12.0" and node2.cuda_driver == 12020
    assert node2.net_plugin == "internal" and node2.network == "IB"
    assert node2.ib_devices == ["mlx5_4:1/RoCE"] and node2.net_kind() == "RoCE"
    assert node2.settings == {"NCCL_IB_HCA": "mlx5_4"} == node4.settings
    assert node4.version is None  # only the first rank prints it
    assert node4.lines_skipped == 1 and node4.skipped_examples == ["node4:565139:565148 [0] NCCL IN"]


def test_roce_between_two_dgx_h100_nccl_2_19_3():
    logs = processes("roce_2.19.3_nccl-tests-185.log")
    assert set(logs) == {("dgxh100-4", 460770), ("dgxh100-3", 2152176)}
    for log in logs.values():
        assert log.net_kind() == "RoCE" and log.net_plugin == "internal"
        assert log.ib_devices == ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]
    assert logs[("dgxh100-4", 460770)].version == "2.19.3"


def test_socket_fallback_seen_on_one_process_nccl_2_18_5():
    logs = processes("socket_fallback_2.18.5_nccl-1121.log")
    rank1 = logs[("ps-SYS-420GP-TNR", 1697708)]
    assert rank1.ib_none and rank1.socket_devices == ["eno1:192.168.223.11"]
    assert logs[("ps-SYS-420GP-TNR", 1697707)].version == "2.18.5"
    assert logs[("ps-SYS-420GP-TNR", 1697707)].cuda_build == "11.8"


def test_mpirun_tagged_lines_socket_between_nodes_shm_inside():
    logs = processes("socket_shm_2node_nccl-1232.log")
    rank0, local_peer = logs[("node0", 13571)], logs[("node0", 13572)]
    assert rank0.transports() == {"NET/Socket"} and rank0.net_kind() == "Socket"
    assert rank0.gdr() is False  # NET connections, none with GDRDMA
    sends = [c for c in rank0.connections() if c.direction == "send"]
    assert [(c.channel, c.src, c.dst, c.network, c.nic) for c in sends] == [
        (0, 0, 1, "Socket", 0),
        (1, 0, 1, "Socket", 0),
    ]
    assert local_peer.intra_node_transports() == {"SHM"}
    (comm,) = logs[("node2", 22556)].comms
    assert (comm.coll_channels, comm.nvls_channels, comm.p2p_channels) == (2, 0, 2)
    assert logs[("node2", 22555)].cuda_driver == 11070


def test_hpcx_plugin_p2p_cumem_and_nvls_channels():
    logs = processes("ibext_nvls_nccl-1814.log")
    rank36 = logs[("hostname-test", 984)]
    (comm,) = rank36.comms
    assert (comm.rank, comm.nranks, comm.complete, comm.comm_id) == (36, 64, True, "0x5ae77eb5ea4ec1ee")
    assert comm.transports() == {"P2P", "NET/IBext_v8"}
    net = [c for c in comm.connections if c.transport == "NET"]
    assert {(c.src, c.dst, c.nic, c.direction) for c in net} == {(36, 20, 3, "send")}
    assert rank36.net_kind() == "IB" and rank36.gdr() is False
    rank35 = logs[("hostname-test", 983)]
    (comm,) = rank35.comms
    assert comm.nvls and (comm.coll_channels, comm.collnet_channels, comm.nvls_channels) == (16, 0, 16)
    assert "NVLS" in rank35.transports()


def test_gdr_trees_init_start_and_warning_nccl_2_21_5():
    logs = processes("ibext_gdr_2.21.5_nccl-tests-252.log")
    rank4 = logs[("kolyoz2", 25146)]
    (comm,) = rank4.comms
    assert (comm.rank, comm.nranks, comm.cuda_dev, comm.bus_id) == (4, 8, 0, "42000")
    assert comm.trees[4] == "5/0/-1->4->-1" and len(comm.trees) == 8
    (net,) = comm.connections
    assert (net.network, net.gdr, net.direction, net.src, net.dst) == ("IBext_v8", True, "receive", 3, 4)
    assert rank4.gdr() is True
    assert rank4.warnings == [
        "NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)"
    ]
    rank3 = logs[("kolyoz1", 27225)]
    assert (rank3.comms[0].nnodes, rank3.comms[0].local_ranks) == (2, 4)
    rank0 = logs[("kolyoz1", 27255)]
    assert rank0.version == "2.21.5" and rank0.cuda_driver == 12060
    assert rank0.lines_skipped == 1  # "Channel 00/0 : 7", cut short in the excerpt


def test_nvls_multicast_roce_ports_nccl_2_22_3():
    logs = processes("roce_nvls_2.22.3_nccl-1538.log")
    gpu6 = logs[("job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0", 5669)]
    assert gpu6.nvls_multicast is True and gpu6.network == "IBext_v8" and gpu6.net_kind() == "RoCE"
    assert len(gpu6.ib_devices) == 8 and gpu6.intra_node_transports() == {"P2P"}
    assert all(c.via == "P2P/CUMEM" for c in gpu6.connections())
    gpu7 = logs[("job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0", 5670)]
    assert gpu7.lines_skipped == 1 and gpu7.skipped_examples[0].endswith("Channel 07/")


def test_version_behind_the_prefix_and_torch_line_interleaved_nccl_2_25_1():
    logs = processes("b200_2.25.1_nccl-1646.log")
    gpu4 = logs[("d5618706-01", 1106803)]
    assert (gpu4.version, gpu4.cuda_build, gpu4.cuda_driver) == ("2.25.1", "12.2", 12080)
    assert gpu4.settings == {"NCCL_SOCKET_IFNAME": "bond0"}
    assert gpu4.lines_skipped == 1 and "ProcessGroupNCCL.cpp" in gpu4.skipped_examples[0]
    assert logs[("d5618706-01", 1106799)].net_plugin == "internal"


def test_rings_trees_and_net_ib_without_gdr_one_process_eight_gpus():
    (log,) = processes("ib_p2p_2node_nccl-1412.log").values()
    assert log.transports() == {"P2P", "NET/IB"} and log.gdr() is False
    assert {c.via for c in log.connections() if c.transport == "P2P"} == {"P2P/direct pointer/read"}
    named = [c for c in log.comms if c.ptr]
    assert sorted(c.rank for c in named) == [3, 5, 6, 7] and {(c.nranks, c.nnodes) for c in named} == {(16, 2)}
    (rings,) = [c for c in log.comms if c.rings]
    assert rings.ring_channels == 8 and rings.rings[1] == [0, 5, 4, 7, 6, 3, 10, 9, 8, 13, 12, 15, 14, 11, 2, 1]
    assert log.lines_skipped == 0


def test_shm_where_p2p_expected():
    logs = processes("shm_h800_nccl-1609.log")
    assert logs[("tj5-sc-ai-h800r-dev01", 533)].intra_node_transports() == {"SHM"}
    assert all(c.via == "SHM/direct/direct" for c in logs[("tj5-sc-ai-h800r-dev01", 534)].connections())


def test_timestamp_and_tag_before_every_line_nccl_2_18_3():
    logs = processes("timestamped_2.18.3_nccl-957.log")
    log = logs[("tomte249", 86388)]
    assert log.network == "IB" and (log.comms[0].rank, log.comms[0].nranks, log.comms[0].cuda_dev) == (0, 2, 5)
    assert log.lines_other == 9 and log.lines_skipped == 0  # the topology dump: NCCL lines diag does not read
    failed = logs[("tomte401", 1850301)]
    assert failed.warnings_total == 4 and failed.warnings[0] == "Cuda failure 'invalid argument'"


def test_ring_neighbours_and_nvls_trees():
    (log,) = processes("nvls_ring_nccl-1519.log").values()
    (comm,) = log.comms
    assert (comm.rank, comm.nranks, comm.nnodes, comm.local_ranks) == (7, 16, 2, 8)
    assert comm.nvls and comm.ring_neighbours == {c: [0, 7, 6] for c in range(7)}


# -- damaged input, made from the real lines above ----------------------------------------------------------------
LINE_A = "hostname-test:984:1257 [4] NCCL INFO Channel 04/0 : 36[4] -> 37[5] via P2P/CUMEM"
LINE_B = "hostname-test:984:1257 [4] NCCL INFO Channel 06/0 : 36[4] -> 20[4] [send] via NET/IBext_v8/3"


def test_two_lines_run_together_by_concurrent_writers_are_skipped_not_misread():
    log = parse_lines([LINE_A, LINE_A[:60] + LINE_B, LINE_B])
    assert [c.channel for c in log.connections()] == [4, 6]
    assert log.lines_skipped == 1 and log.skipped_examples == [(LINE_A[:60] + LINE_B)[:200]]


def test_file_cut_mid_line_counts_the_last_line_as_skipped():
    log = parse_text(LINE_A + "\n" + LINE_B[:50])
    assert len(log.connections()) == 1 and log.lines_total == 2 and log.lines_skipped == 1


def test_garbage_and_huge_lines_are_counted_never_fatal():
    lines = [LINE_A, "\x00\xff\x1b[31m binary", "x" * 100_000, "NCCL INFO", "host:1:2 [0] NCCL INFO Trees garbage"]
    log = parse_lines(lines)
    assert len(log.connections()) == 1
    assert log.lines_total == 5 and log.lines_used == 1 and log.lines_skipped == 4
    assert all(len(example) <= 200 for example in log.skipped_examples)


def test_unknown_nccl_version_is_kept_and_the_rest_still_parsed():
    log = parse_lines(["NCCL version 3.0.0a1+cuda14.0", "h:1:1 [0] NCCL INFO NCCL version v-next", LINE_B])
    assert log.version == "v-next" and log.version_tuple is None
    assert log.transports() == {"NET/IBext_v8"}
    log = parse_lines(["NCCL version 3.0.0a1+cuda14.0", LINE_B])
    assert log.version == "3.0.0a1" and log.version_tuple == (3, 0, 0) and log.cuda_build == "14.0"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_json_round_trip_keeps_everything(name):
    for log in processes(name).values():
        assert NcclLog.from_json(log.to_json()) == log


CRAFTED_LINES = {  # lines a hostile or broken writer leaves, each under MAX_LINE_CHARS (so each is parsed)
    "long host before the marker": "a" * 4000 + " NCCL INFO x",
    "colons before the marker": "a:" * 2000 + " NCCL INFO x",
    "ring then spaces": "h:1:2 [0] NCCL INFO Channel 00/02 : 0" + " " * 4000 + "x",
    "setting then spaces": "h:1:2 [0] NCCL INFO NCCL_DEBUG set to " + " " * 4000 + "x",
    "plugin then spaces": "h:1:2 [0] NCCL INFO NET/Plugin : Loaded net plugin " + " " * 4000 + "x",
    "network then spaces": "h:1:2 [0] NCCL INFO Using network " + " " * 4000 + "x",
    "connection then spaces": "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via " + " " * 4000 + "x",
    "digits before channels": "h:1:2 [0] NCCL INFO " + "1" * 4000 + " coll channels, 1 p2p channels per peer",
    "bare version after junk": "a" * 4000 + "NCCL version 2.18.5",
}


@pytest.mark.parametrize("kind", CRAFTED_LINES)
def test_crafted_long_lines_parse_in_linear_time(kind):
    """A pattern that backtracks over a 4 KB line costs 0.5-5 s a line (an 8 MB log: 17 minutes and more a
    rank); parsed in linear time, 50 such lines take milliseconds. The bound is loose for a loaded machine."""
    import time

    started = time.perf_counter()
    log = parse_text((CRAFTED_LINES[kind] + "\n") * 50)
    assert time.perf_counter() - started < 3.0
    assert log.lines_total == 50


def test_prefix_read_from_its_end_keeps_host_pid_tid_and_location():
    log = parse_text(
        "[1,5]<stdout>:gpu-node-7:4242:4250 [3] NCCL INFO NCCL_IB_HCA set to mlx5_4  \n"
        "2024-01-01T00:00:00 gpu-node-7:4242:4251 [3] transport.cc:12 NCCL WARN oops\n"
        "gpu-node-7 [3] NCCL INFO Using network IB\n"
        "gpu-node-7:4242:4250 [3]NCCL INFO Using network Socket\n"
    )
    assert (log.host, log.pid) == ("gpu-node-7", 4242)
    assert log.settings["NCCL_IB_HCA"] == "mlx5_4" and log.warnings == ["oops"] and log.network == "IB"
    assert log.lines_skipped == 1  # no space between the device and the marker: not NCCL's prefix
