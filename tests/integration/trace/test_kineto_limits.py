"""The Kineto reader refuses absurd metadata in bounded time and memory, and never opens a FIFO (issue 12 item 8)."""

import json


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
