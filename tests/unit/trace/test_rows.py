"""Rows are built and read by name: each table's row builder takes keywords only, fills the columns it is not
given with empty cells, and what the writer writes the loader reads back into the same columns."""

from __future__ import annotations

import pytest

import diag
from diag.trace.schema import COLLECTIVES, STEPS, TABLES
from diag.trace.writer import RankWriter
from tests.conftest import REPO


@pytest.mark.parametrize("table", sorted(TABLES))
def test_row_builder_has_every_column_by_name_and_nothing_by_position(table):
    schema = TABLES[table]
    row = schema.row()
    assert row._fields == tuple(schema.column_names) and all(value is None for value in row)
    with pytest.raises(TypeError):
        schema.row(*range(len(schema.columns)))  # a positional row is what one wrong index misaligns
    with pytest.raises(TypeError):
        schema.row(no_such_column=1)


def test_rows_written_by_name_are_read_back_into_their_columns(tmp_path):
    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=60)
    for step in range(3):
        phases_us = dict.fromkeys(("forward_us", "backward_us", "optimizer_us", "comm_wait_us"), 100)
        writer.append(
            "steps",
            STEPS.row(
                step=step, start_us=1_000 * step, duration_us=900, data_wait_us=5, tokens=128 + step, **phases_us
            ),
        )
        writer.append(
            "collectives",
            COLLECTIVES.row(
                step=step,
                pg="0",
                seq=step + 1,
                op="all_reduce",
                bytes=4096,
                start_us=10,
                duration_us=55.5,
                blocking=1,
                source="py",
            ),
        )
    writer.close()
    trace = diag.load(tmp_path)
    assert trace.steps["tokens"].tolist() == [128, 129, 130] and trace.steps["device_us"].isna().all()
    assert trace.steps["data_wait_us"].tolist() == [5, 5, 5] and trace.steps["samples"].isna().all()
    assert trace.collectives["seq"].tolist() == [1, 2, 3] and trace.collectives["peer"].isna().all()
    assert set(trace.collectives["op"]) == {"all_reduce"} and set(trace.collectives["source"]) == {"py"}


def test_a_column_written_under_its_former_name_is_read_under_its_new_one():
    """sample_traces/straggler-h100 was recorded when the PCIe columns were named ``pcie_*_kbps``."""
    header = (REPO / "sample_traces" / "straggler-h100" / "rank00000" / "telemetry.csv").read_text().splitlines()[1]
    assert "pcie_tx_kbps" in header.split(",")
    telemetry = diag.load(REPO / "sample_traces" / "straggler-h100").telemetry
    assert len(telemetry) and telemetry["pcie_tx_kib_per_s"].notna().any() and "pcie_tx_kbps" not in telemetry


def test_a_file_written_before_columns_were_added_reads_them_empty(tmp_path):
    """The bundled runs predate the steps table's loss, grad_norm and param_fingerprint columns."""
    header = (REPO / "sample_traces" / "straggler" / "rank00000" / "steps.csv").read_text().splitlines()[1]
    assert len(header.split(",")) < len(STEPS.columns)
    steps = diag.load(REPO / "sample_traces" / "straggler").steps
    assert len(steps) and list(steps.columns) == ["rank", *STEPS.column_names]
    assert steps[["loss", "grad_norm", "param_fingerprint"]].isna().all().all()
    assert STEPS.header_columns(header.split(",")) == len(header.split(","))
    assert STEPS.header_columns([*header.split(","), "surprise"]) is None  # a column this diag does not know


@pytest.mark.parametrize("schema_version", [1, 2])
def test_health_values_are_written_with_every_digit(tmp_path, schema_version):
    """A converged loss far below 1 and a replica fingerprint that differs in its last digits survive the
    writer in either format (version 1's CSV rounds other floats to 3 decimals, which would write this loss as
    0.0 and hide the drift; version 2 stores every float as it is)."""
    writer = RankWriter(tmp_path / "rank00000", flush_interval_s=60, schema_version=schema_version)
    loss, grad_norm, fingerprint = 1.2345678e-6, 3.3e-9, -1.5470000000012345
    writer.append(
        "steps",
        STEPS.row(
            step=0,
            start_us=1,
            duration_us=10,
            data_wait_us=0,
            forward_us=0,
            backward_us=0,
            optimizer_us=0,
            comm_wait_us=0,
            device_us=12.34567,
            loss=loss,
            grad_norm=grad_norm,
            param_fingerprint=fingerprint,
        ),
    )
    writer.close()
    row = diag.load(tmp_path).steps.iloc[0]
    assert (row["loss"], row["grad_norm"], row["param_fingerprint"]) == (loss, grad_norm, fingerprint)
    assert row["device_us"] == (12.346 if schema_version == 1 else 12.34567)  # CSV's other floats: 3 decimals


def test_a_table_that_built_rows_still_pickles():
    """A table goes to and from worker processes with what a reader read of it (TraceReader.read_state): its
    cached row type, a namedtuple made at run time, is left out of the pickle and made again on use."""
    import pickle

    steps = TABLES["steps"]
    steps.row(step=1)  # caches row_type and row on the table
    again = pickle.loads(pickle.dumps(steps))
    assert again == steps and again.row(step=3).step == 3
