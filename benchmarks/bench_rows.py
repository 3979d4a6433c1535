"""What building rows by name costs on the training thread, against the positional tuples it replaced.

Each table's row is built the way capture builds it (``TABLES[t].row(column=value, ...)``) and, for comparison,
as the positional tuple literal capture used to build; both in the same process, alternating, with the median
of ``--repeats`` timings of ``--number`` rows each. Then the cost per training step for a step of the shape
bench_capture runs (one steps row, one memory row, ``--phases`` phase rows, ``--collectives`` collective rows).

usage: python benchmarks/bench_rows.py [--repeats 15] [--number 200000] [--phases 3] [--collectives 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import Table, add_json_option  # noqa: E402

from diag.trace.schema import TABLES  # noqa: E402


def by_name(table: str) -> str:
    names = TABLES[table].column_names
    return f"row({', '.join(f'{n}=v{i}' for i, n in enumerate(names))})"


def by_position(table: str) -> str:
    return f"({', '.join(f'v{i}' for i in range(len(TABLES[table].columns)))},)"


def median_us(statement: str, namespace: dict, number: int, repeats: int) -> float:
    times = timeit.repeat(statement, globals=namespace, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--collectives", type=int, default=20)
    add_json_option(parser)
    args = parser.parse_args()
    table = Table("rows", ["table", "columns", "by name (us)", "positional tuple (us)", "added (us)"])
    added = {}
    for table_name, schema in TABLES.items():
        namespace = {"row": schema.row, **{f"v{i}": i for i in range(len(schema.columns))}}
        named = median_us(by_name(table_name), namespace, args.number, args.repeats)
        positional = median_us(by_position(table_name), namespace, args.number, args.repeats)
        added[table_name] = named - positional
        table.add(table_name, len(schema.columns), f"{named:.3f}", f"{positional:.3f}", f"{added[table_name]:.3f}")
    per_step = (
        added["steps"] + added["memory"] + args.phases * added["phases"] + args.collectives * added["collectives"]
    )
    table.note(
        f"per training step (1 steps row, 1 memory row, {args.phases} phases, {args.collectives} collectives): "
        f"{per_step:.2f} us added"
    )
    table.save(args.json)


if __name__ == "__main__":
    main()
