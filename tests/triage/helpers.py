"""Checks shared by the triage tests."""

from __future__ import annotations

import json

import pandas as pd

from diag.trace.schema import rank_dir_name
from diag.triage.analysis import triage
from diag.triage.sources import read_diag_trace


def assert_same_read(path, workers: int, **options) -> dict:
    """The trace read by ``workers`` processes and inline: the same collectives, steps, ranks' states, notes,
    skipped files and verdict (whole, evidence included). Returns the verdict."""
    return same_read(read_diag_trace(path, workers=workers, **options), read_diag_trace(path, workers=1, **options))


def same_read(many, one) -> dict:
    """Two reads of one trace are the same (``assert_same_read``); returns the verdict."""
    pd.testing.assert_frame_equal(many.ops, one.ops)
    if one.steps is None:  # every rank judged from its heartbeat: no table read
        assert many.steps is None
    else:
        pd.testing.assert_frame_equal(many.steps, one.steps)
    assert [str(s) for s in many.skipped] == [str(s) for s in one.skipped]
    assert many.notes == one.notes
    assert {r: i.judged_by_heartbeat for r, i in many.ranks.items()} == {
        r: i.judged_by_heartbeat for r, i in one.ranks.items()
    }
    verdict = triage(many).to_json()
    assert verdict == triage(one).to_json()
    return verdict


def judged(path, heartbeats=True) -> tuple[dict, int]:
    """The verdict without its notes on what was read, and how many ranks were judged from heartbeats."""
    data = read_diag_trace(path, heartbeats=heartbeats)
    verdict = triage(data).to_json()
    verdict["evidence"] = [line for line in verdict["evidence"] if line not in data.notes]
    return verdict, sum(info.judged_by_heartbeat for info in data.ranks.values())


def edit_heartbeat(path, rank: int, edit) -> None:
    file = path / rank_dir_name(rank) / "heartbeat.json"
    heartbeat = json.loads(file.read_text())
    edit(heartbeat)
    file.write_text(json.dumps(heartbeat))
