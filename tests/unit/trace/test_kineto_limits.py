"""The Kineto reader refuses absurd metadata in bounded time and memory, and never opens a FIFO (issue 12 item 8)."""

import json
import os

import pytest

from diag.trace.kineto import read_rank_file


def _trace(meta_value) -> str:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "args": {"stream": 7, "correlation": 1}}]
    return (
        '{"distributedInfo": {"rank": 0}, "deviceProperties": '
        + meta_value
        + ', "traceEvents": '
        + json.dumps(events)
        + "}"
    )


def test_metadata_is_read(tmp_path):
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(_trace('[{"name": "H100", "nested": {"a": [1, 2]}}]'))
    events = read_rank_file(path)
    assert events.meta["deviceProperties"] == [{"name": "H100", "nested": {"a": [1, 2]}}]
    assert events.meta["distributedInfo"] == {"rank": 0} and len(events.kernel_ts) == 1


def test_deeply_nested_metadata_is_refused_quickly(tmp_path):
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(_trace("[" * 100_000 + "]" * 100_000))  # 200 KB: took 6.2 GB with ijson.parse's prefixes
    with pytest.raises(ValueError, match="nested deeper"):
        read_rank_file(path)


def test_fifo_named_like_a_trace_is_not_opened(tmp_path):
    os.mkfifo(tmp_path / "rank0.pt.trace.json")
    with pytest.raises(ValueError, match="not a regular file"):
        read_rank_file(tmp_path / "rank0.pt.trace.json")


def test_huge_kernel_name_is_cut_and_the_trace_read(tmp_path):
    from diag.trace.kineto import MAX_NAME_CHARS

    event = {"ph": "X", "cat": "kernel", "name": "k" * (5 << 20), "ts": 1.0, "dur": 2.0}
    event["args"] = {"stream": 7, "correlation": 1}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": [event]}))
    events = read_rank_file(path)
    assert len(events.kernel_ts) == 1 and [len(name) for name in events.names] == [MAX_NAME_CHARS]
