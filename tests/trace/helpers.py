"""Rows for hand-written trace files, shared by the loader and columnar tests."""

from diag.trace.schema import STEPS


def step_row(step: int, loss=None, first_start_us: int = 1_000_000) -> tuple:
    return STEPS.row(
        step=step,
        start_us=first_start_us + step * 20_000,
        duration_us=20_000,
        data_wait_us=10,
        forward_us=5_000,
        backward_us=9_000,
        optimizer_us=1_000,
        comm_wait_us=2_000,
        samples=32,
        loss=loss,
    )
