"""Which columns of the per-step tables ``diag analyze`` reads: the union of what each analysis declares it reads
(``READS`` beside its code), and the keys every table is read by.

Above a few dozen ranks the loader keeps only these columns of each rank's tables before concatenating them
(``partitioned.AnalysedColumnsReader``; at 16,384 ranks every int64 column dropped is 130 MB less): a column an
analysis reads without declaring it would be missing there, and the analysis would see a trace without it. A
new analysis module that reads a per-step table goes in ``ANALYSES``.
"""

from __future__ import annotations

from diag.analysis import bubble, comms, health, memory, memory_plan, mfu, oom, report, stragglers, telemetry, window
from diag.trace.schema import TABLES

ANALYSES = (bubble, comms, health, memory, memory_plan, mfu, oom, report, stragglers, telemetry, window)
# analyses whose columns of the steps table the engine reads from each rank's files above a few dozen ranks, so
# the steps table loaded whole there leaves them out (memory and telemetry are not loaded whole at all)
READ_BY_RANK = (health,)
KEYS = {"steps": ("step",), "memory": ("step", "time_us"), "telemetry": ("time_us",)}  # rows are matched by these


def analysed_columns(modules=ANALYSES) -> dict[str, tuple[str, ...]]:
    """Per table (steps, memory, telemetry), the columns some analysis of ``modules`` reads, in the table's own
    order."""
    wanted = {table: set(keys) for table, keys in KEYS.items()}
    for module in modules:
        for table, columns in module.READS.items():
            wanted[table].update(columns)
    return {table: tuple(c for c in TABLES[table].column_names if c in wanted[table]) for table in KEYS}


def loaded_columns() -> dict[str, tuple[str, ...]]:
    """The columns of the per-step tables loaded whole above a few dozen ranks: what the analyses read of them,
    but those that read theirs rank by rank."""
    return analysed_columns(tuple(m for m in ANALYSES if m not in READ_BY_RANK))
