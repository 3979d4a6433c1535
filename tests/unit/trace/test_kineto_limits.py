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


def test_reads_grow_only_inside_a_long_token():
    """yajl re-scans a token spanning reads from its start on every read (quadratic in a huge string): the reader
    grows its reads while no read can have ended a string, and ordinary JSON keeps the small reads."""
    import io

    from diag.trace.kineto import _TokenSizedReader

    def read_sizes(data: bytes) -> list[int]:
        reader, sizes = _TokenSizedReader(io.BytesIO(data)), []
        while chunk := reader.read(65536):
            sizes.append(len(chunk))
        return sizes

    base = _TokenSizedReader.BASE_BYTES
    huge = read_sizes(b'{"note": "' + b"a" * (40 << 20) + b'", "traceEvents": []}')
    assert len(huge) < 12 and max(huge) > 8 * base  # 40 MiB in a handful of reads, not 640
    ordinary = read_sizes(json.dumps([{"name": f"kernel {i}", "ts": i} for i in range(100_000)]).encode())
    assert max(ordinary) == base
    escaped = read_sizes(b'{"note": "' + b'\\"' * (8 << 20) + b'"}')  # escaped quotes cannot end the string
    assert len(escaped) < 12


def test_huge_kernel_name_is_cut_and_the_trace_read(tmp_path):
    from diag.trace.kineto import MAX_NAME_CHARS

    event = {"ph": "X", "cat": "kernel", "name": "k" * (5 << 20), "ts": 1.0, "dur": 2.0}
    event["args"] = {"stream": 7, "correlation": 1}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": [event]}))
    events = read_rank_file(path)
    assert len(events.kernel_ts) == 1 and [len(name) for name in events.names] == [MAX_NAME_CHARS]
