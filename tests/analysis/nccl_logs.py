"""Real NCCL debug logs (tests/fixtures/nccl), one process's lines at a time, for the NCCL report, triage and
dashboard tests."""

from __future__ import annotations

from pathlib import Path

from diag.trace.nccl_log import split_processes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def process_lines(fixture: str, host: str, pid: int) -> list[str]:
    text = "\n".join(line for line in (FIXTURES / fixture).read_text().splitlines() if not line.startswith("## "))
    return split_processes(text)[(host, pid)]


SOURCES = {  # a name -> (fixture, host, pid) of a real process's log
    "roce_2.18.5": ("roce_2.18.5_nccl-1052.log", "node2", 14159),
    "roce_nover": ("roce_2.18.5_nccl-1052.log", "node4", 565139),
    "roce_2.19.3": ("roce_2.19.3_nccl-tests-185.log", "dgxh100-4", 460770),
    "socket_2.19.3": ("socket_2.19.3_nccl-1267.log", "instance-8g-96c-4", 101707),
    "shm": ("shm_h800_nccl-1609.log", "tj5-sc-ai-h800r-dev01", 533),
    "p2p_a": ("ibext_nvls_nccl-1814.log", "hostname-test", 984),
    "p2p_b": ("ibext_nvls_nccl-1814.log", "hostname-test", 983),
    "gdr_on": ("ibext_gdr_2.21.5_nccl-tests-252.log", "kolyoz2", 25146),
    "gdr_off": ("ib_p2p_2node_nccl-1412.log", "swat1-04", 2017630),
    "two_channels": ("socket_shm_2node_nccl-1232.log", "node2", 22556),
}
