"""What the Parquet row-group size of a schema-2 segment costs its readers and its writer.

One rank's collectives from a ``diag.testing.synthetic`` run (1,000 steps x 20 collectives), repeated 3x (60,000 rows: about
a compacted segment, 65,536 rows), written with diag's Parquet options (``columnar.parquet_options``) in row
groups of each size; then, in one process, interleaved, minimum over rounds:

* bytes per row;
* a whole read (what ``diag.load``, ``diag analyze`` and ``diag export`` do), categories kept as dictionaries;
* a read of the last row group only (what ``diag triage``'s tail read does);
* compacting 65,536 rows (``columnar.write_parquet``, the writer thread's cost once per 65,536 rows of a table).

    python benchmarks/bench_row_groups.py [--sizes 60000 16384 8192 4096] [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from record import Table, add_json_option  # benchmarks/, the script's own folder

from diag.testing import synthetic
from diag.trace import columnar
from diag.trace.schema import COLLECTIVES


def segment_rows(work: Path, repeat: int) -> pa.Table:
    synthetic.generate(work / "run", 1, 1000, 20, trace_format=2)
    schema = columnar.arrow_schema(COLLECTIVES).remove_metadata()
    one = pq.read_table(work / "run" / "rank00000" / "collectives.000001.parquet", read_dictionary=categories())
    return pa.concat_tables([one.cast(schema)] * repeat).combine_chunks()


def categories() -> list[str]:
    return [c.name for c in COLLECTIVES.columns if c.dtype == "category"]


def write(arrow: pa.Table, rows_per_group: int) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, arrow.schema, **columnar.parquet_options(COLLECTIVES)) as writer:
        writer.write_table(arrow, row_group_size=rows_per_group)
    return sink.getvalue()


def best_ms(action, rounds: int, calls: int = 10) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            action()
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[60000, 16384, 8192, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        arrow = segment_rows(work, 3)
        buffers = {size: write(arrow, size) for size in args.sizes}

        def whole(buffer):
            return lambda: pq.ParquetFile(pa.BufferReader(buffer), read_dictionary=categories()).read(use_threads=False)

        def last(buffer):
            def read():
                file = pq.ParquetFile(pa.BufferReader(buffer), read_dictionary=categories())
                file.read_row_group(file.metadata.num_row_groups - 1, use_threads=False)

            return read

        compact_rows = pa.concat_tables([arrow, arrow]).slice(0, 65536).combine_chunks()
        saved = columnar.ROW_GROUP_ROWS

        def compact(size):
            def run():
                columnar.ROW_GROUP_ROWS = size
                columnar.write_parquet(COLLECTIVES, compact_rows, work / "compacted.parquet")

            return run

        results = {size: {"whole": float("inf"), "last": float("inf"), "compact": float("inf")} for size in args.sizes}
        try:
            for _ in range(args.rounds):  # interleaved: drift in the machine's speed hits every size alike
                for size, buffer in buffers.items():
                    results[size]["whole"] = min(results[size]["whole"], best_ms(whole(buffer), 1))
                    results[size]["last"] = min(results[size]["last"], best_ms(last(buffer), 1))
                    results[size]["compact"] = min(results[size]["compact"], best_ms(compact(size), 1, calls=2))
        finally:
            columnar.ROW_GROUP_ROWS = saved
    columns = ["rows per row group", "bytes/row", "whole segment read", "last row group only", "compacting 65,536 rows"]
    table = Table("row_groups", columns)
    table.note(f"{arrow.num_rows:,} collectives rows; min of {args.rounds} interleaved rounds")
    for size, buffer in buffers.items():
        r = results[size]
        label = f"{size:,}" + (" (diag's)" if size == saved else " (one group)" if size >= arrow.num_rows else "")
        table.add(label, f"{buffer.size / arrow.num_rows:.2f}", f"{r['whole']:.2f} ms", f"{r['last']:.2f} ms",
                  f"{r['compact']:.1f} ms")  # fmt: skip
    table.save(args.json)


if __name__ == "__main__":
    main()
