"""Crafted, tiny or hostile Flight Recorder dumps are refused in bounded time and never run code; FIFOs and
devices under a dump's or a trace file's name never hang triage (issue 12 items 4 and 8)."""

import os
import pickle
from pathlib import Path

import pytest

from diag.triage.flight_recorder import DumpRejected, read_dump_file
from diag.triage.sources import read_input

SELF_LIST = b"\x80\x02]q\x00h\x00a."  # a list that contains itself
SELF_DICT = b"\x80\x02}q\x00X\x01\x00\x00\x00kq\x01h\x00s."  # {"k": <itself>}


def _nested_list_pickle(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def _memo_bomb() -> bytes:
    """Each level a list holding the previous one twice: 2**60 paths from a few hundred bytes."""
    out = b"\x80\x02]q\x00"
    for level in range(1, 61):
        out += b"]" + b"h" + bytes([(level - 1) % 256]) + b"h" + bytes([(level - 1) % 256]) + b"e"
        out += b"q" + bytes([level % 256])
    return out + b"."


@pytest.mark.parametrize(
    "data",
    [SELF_LIST, SELF_DICT, _nested_list_pickle(5000), b"\x80", b"\x80\x02", b"[" * 100000, b"{" * 5 + b"}"],
    ids=["self-list", "self-dict", "deep", "one-byte", "truncated", "deep-json", "broken-json"],
)
def test_hostile_dump_is_rejected(tmp_path, data):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(DumpRejected):
        read_dump_file(path)


def test_memo_bomb_is_bounded(tmp_path):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(_memo_bomb())
    try:
        value = read_dump_file(path)
    except DumpRejected:
        return  # refused: fine
    assert not isinstance(value, dict)  # loaded as shared lists in linear time: not a dump either


class _Exploit:
    """Unpickling this with the standard unpickler would run ``touch <sentinel>``."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_code_is_never_executed(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    payload = pickle.dumps({"entries": [_Exploit(sentinel)]}, protocol=2)
    (tmp_path / "nccl_trace_rank_0").write_bytes(payload)
    with pytest.raises(DumpRejected, match="refused"):
        read_dump_file(tmp_path / "nccl_trace_rank_0")
    with pytest.raises(Exception):  # noqa: B017 - whatever triage says, it must not run the payload
        read_input(tmp_path)
    assert not sentinel.exists()


def test_fifo_dump_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "nccl_trace_rank_0")
    with pytest.raises(DumpRejected, match="not a regular file"):
        read_dump_file(tmp_path / "nccl_trace_rank_0")


def test_huge_rank_in_file_name_and_pg_config(tmp_path):
    (tmp_path / "nccl_trace_rank_99999999999").write_bytes(pickle.dumps({"entries": []}, protocol=2))
    dump = {"entries": [], "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 99999999999]"}}}
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump, protocol=2))
    triage_input = read_input(tmp_path)
    assert triage_input.world_size <= 2
    assert any("99999999999" in str(s) for s in triage_input.skipped)


def test_dump_reader_reads_real_fixture():
    fixtures = sorted(Path("/work/shared/fixtures").rglob("*rank*"))
    dumps = [p for p in fixtures if p.is_file() and p.suffix in ("", ".pkl", ".pickle")]
    if not dumps:
        pytest.skip("no Flight Recorder fixture on this machine")
    value = read_dump_file(dumps[0])
    assert isinstance(value, dict) and "entries" in value
