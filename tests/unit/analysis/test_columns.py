"""Each analysis declares the per-step tables' columns it reads (``READS``), and the loader keeps their union above
a few dozen ranks (analysis/columns.py). A column read without being declared would be missing there: the
analysis would run on a trace without it, silently (the pipeline analysis read steps.optimizer_us so)."""

import ast
from collections import Counter
from pathlib import Path

from diag.analysis import columns
from diag.analysis.partitioned import ANALYSED_COLUMNS
from diag.trace.schema import TABLES

ANALYSIS_DIR = Path(columns.__file__).parent
# modules of diag/analysis that name per-step columns but do not read those tables in `diag analyze`
NOT_ANALYSES = {
    "columns.py",
    "partitioned.py",  # the reader that keeps the columns
    "compare.py",  # diag compare reads whole tables (analyzed_columns_only=False)
    "memory_deep.py",  # memory_deep.json's categories, named as the memory table's columns
}
# a literal that names a per-step column but is something else in that module
OTHER_MEANINGS = {("telemetry.py", "samples")}  # how many NVML samples a GPU's row summarises


def _columns_of_one_table() -> dict[str, str]:
    """Column -> its table, for the per-step tables' columns no other table has (a literal names it alone)."""
    counts = Counter(c for table in TABLES.values() for c in table.column_names)
    return {c: name for name in columns.KEYS for c in TABLES[name].column_names if counts[c] == 1}


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_every_column_an_analysis_names_is_declared_in_its_reads():
    owner = _columns_of_one_table()
    declared = {Path(m.__file__).name: m.READS for m in columns.ANALYSES}
    for path in sorted(ANALYSIS_DIR.glob("*.py")):
        if path.name in NOT_ANALYSES:
            continue
        named = {c for c in _literals(path) if c in owner and (path.name, c) not in OTHER_MEANINGS}
        if not named:
            continue
        assert path.name in declared, f"{path.name} reads {sorted(named)}: add it to columns.ANALYSES with READS"
        undeclared = sorted(c for c in named if c not in declared[path.name].get(owner[c], ()))
        assert not undeclared, f"{path.name} names {undeclared} but its READS does not declare them"


def test_the_loader_keeps_what_the_analyses_declare_in_the_tables_order():
    for table, kept in ANALYSED_COLUMNS.items():
        for module in columns.ANALYSES:
            if module not in columns.READ_BY_RANK:
                assert set(module.READS.get(table, ())) <= set(kept), (module.__name__, table)
        assert list(kept) == [c for c in TABLES[table].column_names if c in kept]
    assert "optimizer_us" in ANALYSED_COLUMNS["steps"]  # the pipeline's stage work adds each stage's optimizer step
    assert "forward_us" not in ANALYSED_COLUMNS["steps"]  # for the views only: not held above a few dozen ranks
    assert "loss" not in ANALYSED_COLUMNS["steps"]  # health reads it rank by rank: never held whole there


def test_the_engine_reads_what_its_analyses_declare():
    """An analysis the engine runs over the ranks' files reads the columns it declares, and those every segment
    holds (a narrower read of a Parquet segment is refused)."""
    from diag.analysis.engine import Plan
    from diag.analysis.health import HealthAnalysis
    from diag.trace.columnar import required_columns

    read = Plan((HealthAnalysis((), None),)).columns()
    assert set(read) == {"steps"}
    assert {"loss", "grad_norm", "param_fingerprint", *required_columns(TABLES["steps"])} <= set(read["steps"])
    assert "tokens" not in read["steps"]
