"""Flight Recorder values are checked for range where a dump is read: a time or sequence number beyond int64
(pickle or JSON) is unknown, not an OverflowError later in triage."""

from __future__ import annotations

import json
import pickle

import pytest

from diag.triage.flight_recorder import load_dump


@pytest.mark.parametrize("as_json", [False, True])
def test_times_and_seqs_beyond_int64_read_as_unknown(tmp_path, as_json):
    entry = {"process_group": ["0", "default_pg"], "profiling_name": "nccl:all_reduce", "state": "completed",
             "collective_seq_id": 10**30, "time_created_ns": -(10**400), "duration_ms": 1e308 * 10,
             "frames": [{"name": "f", "filename": "train.py", "line": 10**40}]}  # fmt: skip
    good = {**entry, "collective_seq_id": 4, "time_created_ns": 1_795_385_910_061_116_000, "duration_ms": 2.5}
    dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "ranks": "[0, 1]"}}, "entries": [entry, good]}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(json.dumps(dump).encode() if as_json else pickle.dumps(dump, protocol=2))
    bad, kept = load_dump(path).entries
    assert (bad.seq, bad.time_created_ns, bad.duration_ms, bad.frames[0][2]) == (-1, None, None, 0)
    assert (kept.seq, kept.time_created_ns, kept.duration_ms) == (4, 1_795_385_910_061_116_000, 2.5)
