"""Time to parse a torch.profiler (Kineto) trace holding one huge string, and an ordinary trace, read as ijson
reads by default (64 KiB pieces) and through diag's token-sized reader (diag/trace/kineto.py).

yajl re-scans a token that spans two reads from its start on every read, so a string of S bytes read in B-byte
pieces costs about S^2 / B; diag's reader grows its reads while inside such a token. Printed: median seconds
over --repeat runs of a full parse (ijson.basic_parse), each variant alternated with the other in one process.

    python benchmarks/bench_kineto_tokens.py --sizes-mb 10,20,40,300 --repeat 3

Results and the command: docs/benchmarks.md ("Kineto traces with huge strings").
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ijson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diag.trace.kineto import _TokenSizedReader  # noqa: E402

ORDINARY = REPO.parent / "shared/fixtures/hta-public/df_index_resolver/df_index_resolver.json.gz"
PLAIN_LIMIT_MB = 40  # ijson's plain reads past this take minutes (quadratic): not timed


def _huge_string_trace(path: Path, size_mb: int) -> None:
    event = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "args": {"stream": 7}}'
    with open(path, "w") as out:
        out.write('{"distributedInfo": {"rank": 0}, "note": "')
        out.write("a" * (size_mb * 1_000_000))
        out.write(f'", "traceEvents": [{event}]}}')


def _parse_s(path: Path, token_sized: bool) -> float:
    start = time.perf_counter()
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
        for _ in ijson.basic_parse(_TokenSizedReader(handle) if token_sized else handle):
            pass
    return time.perf_counter() - start


def _row(name: str, path: Path, repeat: int, plain_too: bool) -> None:
    times = {"ijson 64 KiB reads": [], "diag token-sized reads": []}
    for _ in range(repeat):
        if plain_too:
            times["ijson 64 KiB reads"].append(_parse_s(path, token_sized=False))
        times["diag token-sized reads"].append(_parse_s(path, token_sized=True))
    cells = [f"{statistics.median(v):.3f} s" if v else "not run (minutes)" for v in times.values()]
    print(f"| {name} | {' | '.join(cells)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="10,20,40,300")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| trace | ijson 64 KiB reads | diag token-sized reads |\n|---|---|---|")
    if ORDINARY.exists():
        _row(f"ordinary: {ORDINARY.name} ({ORDINARY.stat().st_size >> 20} MiB gz)", ORDINARY, args.repeat, True)
    with tempfile.TemporaryDirectory() as tmp:
        for size_mb in (int(s) for s in args.sizes_mb.split(",")):
            path = Path(tmp) / f"huge{size_mb}.pt.trace.json"
            _huge_string_trace(path, size_mb)
            _row(f"one {size_mb} MB string", path, args.repeat, size_mb <= PLAIN_LIMIT_MB)
            path.unlink()


if __name__ == "__main__":
    main()
