"""Time to parse a torch.profiler (Kineto) trace holding one huge string, and an ordinary trace, read as ijson
reads by default (64 KiB pieces) and through diag's token-sized reader (diag/trace/kineto.py).

yajl re-scans a token that spans two reads from its start on every read, so a string of S bytes read in B-byte
pieces costs about S^2 / B; diag's reader grows its reads while inside such a token. Printed: median wall and
CPU seconds over --repeat runs of a full parse (ijson.basic_parse), each variant alternated with the other in one
process.

    python benchmarks/bench_kineto_tokens.py --sizes-mb 10,20,40,300 --repeat 5 [--json PATH]

The ordinary trace is HTA's df_index_resolver trace in ../shared/fixtures (``DIAG_SHARED_FIXTURES`` names
another fixtures directory); without it that row is left out and a note says so. Results and the command:
docs/benchmarks.md ("Kineto traces with huge strings").
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ijson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from record import Table, add_json_option  # noqa: E402

from diag.trace.kineto import _TokenSizedReader  # noqa: E402

FIXTURES = Path(os.environ.get("DIAG_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))
ORDINARY = FIXTURES / "hta-public/df_index_resolver/df_index_resolver.json.gz"
PLAIN_LIMIT_MB = 40  # ijson's plain reads past this take minutes (quadratic): not timed


def _huge_string_trace(path: Path, size_mb: int) -> None:
    event = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "args": {"stream": 7}}'
    with open(path, "w") as out:
        out.write('{"distributedInfo": {"rank": 0}, "note": "')
        out.write("a" * (size_mb * 1_000_000))
        out.write(f'", "traceEvents": [{event}]}}')


def _parse_s(path: Path, token_sized: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one full parse."""
    start, start_cpu = time.perf_counter(), time.process_time()
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
        for _ in ijson.basic_parse(_TokenSizedReader(handle) if token_sized else handle):
            pass
    return time.perf_counter() - start, time.process_time() - start_cpu


def _row(table: Table, name: str, path: Path, repeat: int, plain_too: bool) -> None:
    times = {"ijson 64 KiB reads": [], "diag token-sized reads": []}
    for _ in range(repeat):
        if plain_too:
            times["ijson 64 KiB reads"].append(_parse_s(path, token_sized=False))
        times["diag token-sized reads"].append(_parse_s(path, token_sized=True))
    table.add(name, *(_median_cell(v) if v else "minutes (not run)" for v in times.values()))


def _median_cell(samples: list[tuple[float, float]]) -> str:
    wall, cpu = statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)
    return f"{wall:.3f} s ({cpu:.3f} s CPU)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="10,20,40,300")
    parser.add_argument("--repeat", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    table = Table("kineto_tokens", ["trace", "ijson 64 KiB reads", "diag token-sized reads"])
    if ORDINARY.exists():
        name = f"ordinary: HTA's {ORDINARY.name} ({ORDINARY.stat().st_size >> 20} MiB gz)"
        _row(table, name, ORDINARY, args.repeat, True)
    with tempfile.TemporaryDirectory() as tmp:
        for size_mb in (int(s) for s in args.sizes_mb.split(",")):
            path = Path(tmp) / f"huge{size_mb}.pt.trace.json"
            _huge_string_trace(path, size_mb)
            _row(table, f"one {size_mb} MB string", path, args.repeat, size_mb <= PLAIN_LIMIT_MB)
            path.unlink()
    table.note(f"wall (CPU): medians of {args.repeat} full parses (ijson.basic_parse), the two readers alternating")
    if not ORDINARY.exists():
        table.note(f"no ordinary trace: {ORDINARY} not found (DIAG_SHARED_FIXTURES)")
    table.save(args.json)


if __name__ == "__main__":
    main()
